"""The course's reference datasets, one module per storage format.

Chapters build each of these up step by step and then show the version here; the
grader, the benchmark and later chapters import them from here.

Beside the datasets: :mod:`~packlab.loaders.batching` (the fast path: uint8 pixels made
into float batches in one step), :mod:`~packlab.loaders.skipping` (skip bad samples and
count them) and :mod:`~packlab.loaders.with_webdataset` (the same tar pipeline written
with the ``webdataset`` library).

Two loaders of chapter 8 replace the ``DataLoader`` itself for any of these datasets:
:class:`~packlab.loaders.threads.ThreadLoader` (threads of the training process) and
:class:`~packlab.loaders.recycling.RecyclingLoader` (worker processes writing into
recycled shared-memory batch buffers).
"""

from packlab.loaders.folder import FileFolderDataset, JpegFolderDataset, RawFolderDataset
from packlab.loaders.zip import NaiveZipDataset, PreadZipDataset, ZipDataset, open_archive_in_worker
from packlab.loaders.tar import TarShardDataset
from packlab.loaders.skipping import BadSampleWarning, SkipCounter, SkippedSample, collate_skipping_bad
from packlab.loaders.batching import collate_uint8_images
from packlab.loaders.recycling import BatchBufferPool, RecyclingLoader
from packlab.loaders.threads import ThreadLoader
