"""The course's reference datasets, one module per storage format.

Chapters build each of these up step by step and then show the version here; the
grader, the benchmark and later chapters import them from here.
"""

from packlab.loaders.folder import FileFolderDataset, JpegFolderDataset, RawFolderDataset
from packlab.loaders.zip import NaiveZipDataset, ZipDataset, open_archive_in_worker
from packlab.loaders.tar import TarShardDataset
