"""python -m solo.zoo list | export <pretrained> <out.safetensors | out.pth | out.bin>"""

import argparse
import sys

import solo.zoo
from solo.errors import SoloError


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m solo.zoo", description="The solo checkpoint zoo.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the zoo's checkpoints and their results")
    export = commands.add_parser(
        "export",
        help="a backbone as a plain timm (.safetensors) or torchvision (.pth) state dict; a CLIP or SigLIP "
        "with open_clip towers (method.model) as an open_clip state dict (.bin, .pt or .safetensors)",
    )
    export.add_argument(
        "pretrained",
        help="zoo name, solo .safetensors file, training checkpoint (step-<N> folder or .pt) or run directory",
    )
    export.add_argument("out")
    args = parser.parse_args()
    try:
        run(args)
    except SoloError as e:  # what the user can act on: one line, exit status 2, as the training entry points
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def run(args: argparse.Namespace) -> None:
    if args.command == "list":
        for name in solo.zoo.list():
            e = solo.zoo.entry(name)
            results = ", ".join(f"{kind} {r['acc1']:.3f}" for kind, r in e["results"].items())
            print(f"{name:<36} {e['method']:<13} {e['backbone']['name']:<10} {e['data']['name']:<8} {results}")
    elif solo.zoo.resolve(args.pretrained).method.get("model"):
        print(solo.zoo.export_open_clip(args.pretrained, args.out))
    else:
        print(solo.zoo.export_backbone(args.pretrained, args.out))


if __name__ == "__main__":
    main()
