"""Other packed formats, measured side by side with the course's own (chapter 9).

One module per format, each with a writer (``write_*``, and ``ensure_*`` that writes once
under :func:`packlab.paths.packed_dir`), a map-style dataset with one handle per process,
and the first attempt that opens its handle in ``__init__`` (``Naive*``), kept to show
what each library does with DataLoader workers:

* :mod:`~packlab.formats.lmdb_format`: LMDB, one memory-mapped B+tree file; by key, or
  scanned in key order with a cursor (:class:`LmdbStreamDataset`);
* :mod:`~packlab.formats.hdf5_format`: HDF5 through h5py, a variable-length ``uint8``
  dataset of JPEG bytes plus labels and keys;
* :mod:`~packlab.formats.parquet_format`: Parquet through pyarrow, row groups of keys,
  labels and encoded images; by row group (:class:`ParquetStreamDataset`);
* :mod:`~packlab.formats.npz_format`: NumPy ``.npz``, a zip of ``.npy`` arrays.

:mod:`~packlab.formats.common` holds what they share (the per-process handle, the
map-style and block-stream datasets); :mod:`~packlab.formats.bench` measures every format
and the folder, zip and tar shards of chapters 1-5 on the same data in the same run
(``make bench`` and chapter 9).
"""

from packlab.formats.common import DamagedSampleError, PerProcessHandle
from packlab.formats.hdf5_format import Hdf5Dataset, NaiveHdf5Dataset, ensure_hdf5, write_hdf5
from packlab.formats.lmdb_format import (
    LmdbDataset,
    LmdbStreamDataset,
    NaiveLmdbDataset,
    close_environment,
    ensure_lmdb,
    open_environment,
    write_lmdb,
)
from packlab.formats.npz_format import NaiveNpzDataset, NpzDataset, ensure_npz, write_npz
from packlab.formats.parquet_format import (
    NaiveParquetDataset,
    ParquetDataset,
    ParquetStreamDataset,
    ensure_parquet,
    write_parquet,
)
