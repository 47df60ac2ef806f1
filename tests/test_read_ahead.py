"""MapDataSource.prepare_with(prepare, ahead=True): the next batch read and prepared in a thread while the consumer
holds this one, and the source's position counted as the consumer receives batches, never as they are read ahead."""

import threading

import pytest
import torch

from solo.data.sampling.source import MapDataSource, read_ahead

SAMPLES, BATCH = 12, 2


class Numbers:
    """Sample (epoch, i) is {"index": i}: the batches say which samples they hold."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, key):
        return {"index": torch.tensor(key[1])}


def source(prepare=None, ahead=True, workers=0) -> MapDataSource:
    s = MapDataSource(Numbers(), BATCH, 0, 1, seed=5, num_workers=workers)
    if prepare:
        s.prepare_with(prepare, ahead)
    return s


def indices(batches) -> list[list[int]]:
    return [b["index"].tolist() for b in batches]


class Recorder:
    """A prepare that records which batches it saw, and lets a test wait until it has seen `count` of them."""

    def __init__(self, fail_at: int | None = None):
        self.seen, self.fail_at, self.changed = [], fail_at, threading.Condition()

    def __call__(self, batch: dict) -> dict:
        if len(self.seen) == self.fail_at:
            raise ValueError(f"batch {self.fail_at} cannot be prepared")
        with self.changed:
            self.seen.append(batch["index"].tolist())
            self.changed.notify_all()
        return {**batch, "prepared": True}

    def wait_for(self, count: int, seconds: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.seen) >= count, seconds)


def test_the_next_batch_is_prepared_while_the_consumer_holds_this_one_and_not_counted():
    expected = indices(source())
    prepare = Recorder()
    s = source(prepare, workers=1)  # as the trainer reads ahead: the samples read by a DataLoader worker
    batches = iter(s)
    first = next(batches)
    assert first["prepared"] and first["index"].tolist() == expected[0]
    # The consumer holds batch 0 and asks for nothing: batch 1 is prepared meanwhile.
    assert prepare.wait_for(2, seconds=30), "the next batch was not prepared while the consumer held this one"
    assert prepare.seen == expected[:2]
    assert s.batch_in_epoch == 1, "the batch read ahead was counted: a checkpoint now would resume past it"
    rest = list(batches)
    assert indices([first, *rest]) == expected and all(b["prepared"] for b in rest)
    assert s.batch_in_epoch == len(expected) == SAMPLES // BATCH


def test_the_known_wrong_variants_prepare_nothing_ahead_or_count_the_batch_read_ahead():
    expected = indices(source())
    prepare = Recorder()
    in_turn = iter(source(prepare, ahead=False))
    next(in_turn)
    assert not prepare.wait_for(2, seconds=0.5), "without ahead, nothing is prepared until it is asked for"
    in_turn.close()
    # Reading ahead from outside the source: the source counts the batch read ahead as one trained on.
    prepare = Recorder()
    s = source()
    outside = read_ahead(s, prepare)
    assert next(outside)["index"].tolist() == expected[0]
    assert prepare.wait_for(2, seconds=30)
    assert s.batch_in_epoch == 2
    outside.close()


def test_a_source_resumed_from_its_position_reads_the_batches_not_received():
    """Checkpointed after 2 batches received (a third already read ahead), the resumed source reads from the third."""
    expected = indices(source())
    s = source(Recorder())
    batches = iter(s)
    received = [next(batches), next(batches)]
    state = s.state_dict()
    batches.close()
    resumed = source(Recorder())
    resumed.load_state_dict(state)
    assert indices(received) + indices(resumed) == expected


def test_an_error_reaches_the_consumer_at_its_batch_and_the_thread_ends():
    expected = indices(source())
    batches = iter(source(Recorder(fail_at=2)))
    assert indices([next(batches), next(batches)]) == expected[:2]
    with pytest.raises(ValueError, match="batch 2 cannot be prepared"):
        next(batches)
    assert not [t for t in threading.enumerate() if t.name.startswith("solo-read-ahead")]


def test_stopping_early_leaves_no_thread():
    for _ in source(Recorder()):
        break
    assert not [t for t in threading.enumerate() if t.name.startswith("solo-read-ahead")]
