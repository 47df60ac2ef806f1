"""The YAML configs Hydra composes (a package so that an installed solo finds them: `pkg://solo.configs`)."""
