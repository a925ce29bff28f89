"""How the checks teach: a nudge before the code-level hint, and stages for long exercises.

**Two levels of hint.** Every part of a check has two hints. Level 1, the *nudge*, points
at the idea (what to think about, which chapter showed it) without saying what to type;
it is what ``check()`` prints by default. Level 2 is the part's code-level hint, kept
with the part in its exercise module (``register(...)``); ``check(..., hints=2)`` prints
both. A part that fails only because the attendee has not written that code yet (the
stub's ``NotImplementedError("your code here")``) gets neither: it is "not started".

**Stages.** A long exercise is taught in stages: the core parts first, the stretch parts
for whoever is ahead. :data:`STAGES` names groups of a check's parts, and
``check(id, candidate, parts="core")`` runs one group (``parts=[...]`` takes part names).

Both tables are keyed by check id and part name; ``tests/test_grading_teaching.py``
fails when a registered part has no nudge, or a stage names a part that does not exist,
so a new part gets its nudge where it is added.
"""

from __future__ import annotations

#: Level-1 hints: ``{check id: {part name: nudge}}``.
NUDGES: dict[str, dict[str, str]] = {
    "jpeg_dataset": {
        "length": "a Dataset's length is the number of keys it serves: which keys does it serve when none are given?",
        "items": "what does the index say about which sample to return, and in which order were the keys given?",
        "labels_pixels": "the label belongs to the key, not to the position; and the transform wants the file exactly as it is on disk",
        "workers": "each worker gets a copy of the dataset and only an index: can one item be built from the index alone?",
        "bad_key": "a key without a file is an error to report, with the key in it, not a gap to fill",
    },
    "jpeg_timing": {
        "epochs": "one time per full pass over the loader, as many passes as asked",
        "images": "count what the loader actually delivered; the last batch can be short",
        "startup": "when does a pass start for whoever waits for it? Before or after the first batch arrives?",
        "rate": "images per second over everything: all images, divided by all the time",
    },
    "zip_pack": {
        "valid_zip": "a zip's table of contents is written at the end: when does your archive get its end?",
        "jpeg_members": "the encoded variant stores each file's bytes exactly as they are on disk, under the sample's key",
        "raw_members": "the raw variant stores decoded, resized pixels, as chapter 2's raw members are",
        "labels": "the archive must be readable on its own: where do its labels live?",
        "stored": "chapter 2 packs without compression: JPEG bytes do not shrink, and every read would pay for inflating",
    },
    "zip_dataset": {
        "items": "the archive says which samples it holds: where in it are they listed?",
        "jpeg_epoch": "an encoded member is a JPEG file: the same transform as for the folder applies",
        "raw_epoch": "a raw member is only bytes: which shape and type did the packer give them?",
        "self_contained": "everything the dataset needs must come out of the archive itself",
    },
    "per_worker_zip": {
        "no_handle_in_init": "chapter 3: what happens to a handle opened in __init__ once the workers start?",
        "pickle_after_use": "a spawn worker receives a pickled copy of the dataset: what in it cannot be pickled?",
        "pixels": "the bytes of a member are a JPEG file: the dataset's transform turns them into the tensor",
        "fork": "chapter 4: which process opened the handle this read goes through?",
        "fork_after_parent_read": "after the parent has read once, a forked worker inherits its open handle: how does the worker know it is not its own?",
        "spawn": "under spawn the worker imports your class and unpickles your dataset: both must work in a fresh process",
        "close": "a process should be able to let go of every handle it opened",
    },
    "tarfile_reader": {
        "one_process": "a shard is a row of members; a sample is every member that shares one key, and it is complete "
                       "once all of them have come by",
        "fork_3_workers": "every worker runs __iter__ on its own copy of the dataset: how does each one know which "
                          "shards are its share?",
        "spawn_2_workers": "under spawn the dataset is pickled into each worker: what must it not hold yet?",
        "member_order": "chapter 5's convention promises that a sample's members are adjacent, not in which order "
                        "they come",
        "incomplete_sample": "a sample that lacks a member is damage to report, with where it is, not a gap to step over",
        "last_sample": "when does your loop hand out a sample, and what is still waiting when the members run out?",
    },
    "tar_write": {
        "shards": "how many samples go in one shard, and how are the shards named in the WebDataset convention?",
        "samples": "chapter 5: a sample is a group of members that share a key, one per field",
        "sample_order": "the members of one sample must follow each other, in the order the samples were shuffled",
        "shuffled": "chapter 5, 'Why shuffle before sharding': when does the order get mixed?",
        "seeded": "the same seed must give the same shards, without touching anyone else's random state",
    },
    "tar_dataset": {
        "one_process": "a shard is read front to back as a stream; a sample is complete once all its members have come by",
        "fork_3_workers": "every worker runs __iter__ on its own copy: how does each one know which shards are its share?",
        "spawn_2_workers": "under spawn the dataset is pickled into each worker: what must it not hold yet?",
        "shuffle_epochs": "the workers must agree on one shard order per epoch, or they overlap and skip",
        "shard_order": "with shuffling on, each epoch should read the shards in another order",
        "reproducible": "the order must follow from the seed and the epoch alone, in whichever process computes it",
        "seeded": "a different seed must give a different order",
        "bounded_buffer": "a shuffle buffer holds a fixed number of samples, however long the shard",
        "truncated_shard": "chapter 5: how does a reader tell a shard that ended from one that was cut off?",
        "streamed": "over HTTP or S3 a shard is a stream you cannot seek back in: what can you still see as it goes by?",
        "persistent_workers": "persistent workers keep the copy of the dataset they got at the start: how does a new epoch reach them?",
    },
    "bottleneck_answer": {
        "pace_answered": "one answer per worker count you measured in Part B, in one of the three words",
        "pace_follows_your_runs": "your answer is what your runs said, even where you expected the other side",
        "why": "say in your own words which side was slower here, and what made it so on this machine",
    },
    "shard_split": {
        "exactly_once": "every shard must land with exactly one (rank, worker) pair, whatever the counts",
        "balanced": "no reader should get more than one shard more than another",
        "rank_first": "chapter 6: ranks split the shards first, and each rank's workers split the rank's share",
        "too_few_shards": "with fewer shards than readers someone gets nothing: say so before anyone waits",
        "pure": "the same arguments must give the same answer, without changing the list passed in",
    },
    "rank_dataset": {
        "one_rank": "without DataLoader workers the dataset is still read by one worker: which one?",
        "two_ranks": "inside __iter__, both the rank and the worker decide the share",
        "three_ranks": "shard counts that do not divide evenly must still be read exactly once",
        "too_few_shards": "the split's error is the message the user needs: let it reach them",
    },
    "bottleneck": {
        "consumer_alone": "time the consumer on batches that are already in memory, so no loading is in that number",
        "together": "the pair is the loader feeding the consumer, batch by batch, timed the same way",
        "startup": "start-up is a one-off wait, not a rate: keep it out of images per second",
        "warm": "the first pass pays for things later passes do not (cold files, worker start-up)",
        "threads": "the consumer's speed depends on its torch threads: use the number asked for, and leave the setting as you found it",
        "decides": "the slower side sets the pace; compare like with like",
        "turns": "chapter 7: a machine's speed drifts; which order of runs lets the drift fall on every side alike?",
        "verdict": "chapter 7: when is a difference a difference? The course has one rule for that, and it is not the medians alone",
    },
    "parallel_map": {
        "in order": "results must come out in the order the items went in, even if they finish in another order",
        "in parallel": "several items must be worked on at once, not one after another",
        "bounded": "never take more from the input than you can have in flight",
        "errors name the item": "when one item fails, the error should say which item",
        "no thread left behind": "a generator can be abandoned half-way: what stops your threads then?",
        "any items": "the items can be anything an iterable yields, equal to each other or None, and so can the results: "
                     "what must you not use them for?",
    },
    "lmdb_write": {
        "one_file": "chapter 9: an LMDB database can be one file rather than a folder",
        "one_record_per_sample": "one key per sample, and nothing but samples",
        "labels": "the course's layout keeps the label in front of the image bytes, in a fixed width",
        "jpeg_bytes": "store the image exactly as it is on disk",
        "atomic": "a reader must never find a half-written database under the final name",
        "root": "the images come from the data folder you are given, not always the default one",
        "any_order": "the samples can arrive in any order: does your way of writing assume sorted keys?",
        "one_transaction": "each write transaction costs a sync: how many does the whole file need?",
        "tidy": "look beside the file when you are done, and after a write that failed: what did LMDB or you leave there?",
        "replaces": "a file from an earlier run may be there already, and so may a temporary file from a run that crashed",
    },
    "lmdb_dataset": {
        "no_env_in_init": "the same lesson as the zip: what does a handle opened in __init__ do to the workers?",
        "pixels": "a value holds two things in the course's layout: split it the way the writer joined it",
        "fork": "each worker must read through an environment it opened itself",
        "fork_after_parent_read": "after the parent has read, workers inherit its environment; LMDB is strict about that",
        "spawn": "under spawn the dataset is pickled and the class imported in a fresh process",
        "fresh_reads": "a read transaction kept open sees an old snapshot: how long should one live?",
        "close": "a process should be able to let go of what it opened",
        "keys": "with no keys given the dataset serves every record; with keys, those in the order given",
        "items": "the course's layout joins label and image in one value; the transform wants the image as stored",
        "read_only": "many processes read the same file at once: how should each open it so that none writes anything?",
    },
    "resuming_shards": {
        "reads_once": "with no failure, the shard's samples pass through unchanged",
        "resumes": "after a broken connection the shard starts again from its beginning: what must not be delivered twice?",
        "several_breaks": "the connection can break more than once: what you delivered adds up over all attempts",
        "gives_up": "retrying forever hides an outage: stop after the attempts allowed and let the error out",
        "waits": "chapter 10: wait longer after each failure",
        "damage_not_retried": "a damaged shard stays damaged: only a broken connection is worth another attempt",
    },
    "fast_path": {
        "window_valid": "chapter 11: which ranges of area and shape does RandomResizedCrop draw from, and how often does it mirror?",
        "window_reproducible": "which random generator does your draw use, and what else has drawn from it before? Is every number you seed it with the same in a fresh interpreter?",
        "window_epochs": "which numbers go into a sample's seed? A new epoch should see new crops",
        "crop_pixels": "what is resized to 224: the window or the whole image? And how many pixels does the window keep after a reduced decode?",
        "reduced_decode": "a JPEG can be decoded at 1/2, 1/4 or 1/8 scale: which size decides how far, the image's or the crop's?",
        "dataset_epoch": "chapter 5: which copy of the dataset does a persistent worker read, and where does the epoch live?",
        "worker_counts": "what differs between one worker and three, and may any of it reach a sample's crop?",
        "resume": "chapter 12: after a resume, which position does the wrapped reader start from, and do the crops depend on it?",
        "store_max_side": "chapter 11, 'Store what you train on': what does FFCV's max_resolution keep, and what does it never do?",
    },
    "resumable_reader": {
        "sample_granularity": "chapter 12: where does a reader stand after the last sample it handed out?",
        "buffer": "a sample that was read into the shuffle buffer is not yet delivered",
        "same_order": "resuming must continue the very epoch that was interrupted, random choices included",
        "one_batch_per_run": "chapter 12: a resumed worker that has sent no batch yet, where is it saved?",
        "killed_fork": "each worker reads its own shards: whose position is saved, and where does it live?",
        "killed_spawn": "what is saved must survive being written to a file and read back in a new process",
        "two_epochs": "chapter 5: which copy of the dataset does a persistent worker read, and when does it see "
                      "set_epoch?",
        "other_epoch": "a position in epoch 0 says nothing about epoch 1: how would the reader know which it holds?",
        "sigterm_group": "chapter 12: when the scheduler signals every process of the job, who should decide to stop?",
        "sigterm_startup": "chapter 12: a spawn worker takes seconds to start; what protects it before any of your code runs in it?",
    },
    "interleaved_shuffle": {
        "one_process": "each shard is a stream of samples: which helper reads one, and through which opener?",
        "two_workers": "every worker runs __iter__ on its own copy: which part of this epoch's shard order is its own?",
        "open_shards": "an open shard costs a handle, not its samples: how many may be open, and when does the next one open?",
        "bounded_buffer": "a buffer that yields as it reads holds a fixed number of samples: does yours wait for the end?",
        "epochs": "which numbers may decide the order, so that any process gets the same one, and a new epoch another?",
        "persistent_workers": "chapter 5: what reaches a worker that keeps its first copy of the dataset?",
        "mixing": "neighbouring samples from one shard share a class here: where should each next sample come from?",
        "accuracy": "chapter 13: what happens to a model that sees one class for a long stretch?",
    },
}

#: Groups of parts, for staging a long exercise: ``{check id: {stage: (part names, ...)}}``.
#: Exercise 4 (chapter 5) is the longest of the course: its core is the whole writer and
#: a reader that gives every sample exactly once with workers under fork and spawn; the
#: reader's stretch parts (per-epoch shuffling, a bounded buffer, truncated shards, a
#: stream that cannot seek, persistent workers) are
#: for whoever is ahead of the room.
STAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "tar_write": {
        "core": ("shards", "samples", "sample_order", "shuffled", "seeded"),
    },
    "tar_dataset": {
        "core": ("one_process", "fork_3_workers", "spawn_2_workers"),
        "stretch": ("shuffle_epochs", "shard_order", "reproducible", "seeded", "bounded_buffer", "truncated_shard",
                    "streamed", "persistent_workers"),
    },
    "fast_path": {
        "core": ("window_valid", "window_reproducible", "window_epochs", "crop_pixels", "reduced_decode",
                 "dataset_epoch", "worker_counts", "resume"),
        "stretch": ("store_max_side",),
    },
}


#: The code of a stretch stage, by exercise notebook: the functions and methods whose solution
#: blocks only the stretch parts need. A core-only attendee leaves them as stubs; the schedule
#: counts the core stage's lines without them (:mod:`packlab.course.schedule.tracks`).
STRETCH_CODE: dict[str, tuple[str, ...]] = {
    "04_tar_shards": ("set_epoch", "_buffer_shuffle"),
    "10_fast_path": ("store",),
}


def nudge(check_id: str, part: str, description: str) -> str:
    """The level-1 hint of one part; a part without one points back at what the part checks."""
    found = NUDGES.get(check_id, {}).get(part)
    return found if found else f"look again at what this part checks: {description}"


def stage_parts(check_id: str, stage: str) -> tuple[str, ...] | None:
    """The parts of ``stage`` of a check, or None when the check has no such stage."""
    return STAGES.get(check_id, {}).get(stage)
