"""Feeding a GPU: pinned memory, copies that overlap compute, decoding and normalising on the device.

On a machine with a CUDA GPU the loader's last steps can move off the CPU:

* **uint8 across, float on the device.** The batch crosses from the workers and over
  PCIe as uint8 (a quarter of the float bytes) and becomes float, normalised, on the GPU
  (:func:`packlab.loaders.batching.to_float_batch` with ``device=``), where that costs
  next to nothing.
* **Pinned memory and non-blocking copies.** A copy from ordinary (pageable) host memory
  makes the CUDA driver stage it through a pinned buffer of its own and blocks the
  host; from page-locked ("pinned") memory the GPU's copy engine reads the batch
  directly, and with ``non_blocking=True`` the call returns at once. ``DataLoader(...,
  pin_memory=True)`` pins each batch in a thread of the training process.
* **A side stream.** :class:`CudaPrefetcher` issues the copy and conversion of the next
  batches on a CUDA stream of its own while the model computes on the current stream,
  and makes the current stream wait (an event) only where it uses the batch.
  ``Tensor.record_stream`` tells PyTorch's caching allocator that the batch, allocated
  on the side stream, is used on the current one, so its memory is not handed out
  again before the current stream is done with it.
* **nvJPEG.** ``torchvision.io.decode_jpeg(list_of_tensors, device="cuda")`` decodes a
  whole list of JPEGs on the GPU with NVIDIA's nvJPEG (:func:`nvjpeg_decode_and_resize`);
  the encoded bytes cross, not even the uint8 pixels. (torchvision 0.29 deprecates
  ``decode_jpeg`` in favour of TorchCodec; the course pins 0.28.)

Every function here needs CUDA; :func:`cuda_status` says whether there is one, and the
chapters and ``make bench`` skip these measurements, saying so, when there is not.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import torch

from packlab.loaders.batching import FloatBatches, to_float_batch
from packlab.transforms import IMAGE_SIZE


def cuda_status() -> str:
    """One line: the GPU torch sees, or why there is none."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA device: torch {torch.__version__} was built with CUDA {built}, but no GPU is visible"
                if built else f"no CUDA device: torch {torch.__version__} is a CPU-only build")
    index = torch.cuda.current_device()
    return f"CUDA device {index}: {torch.cuda.get_device_name(index)} (torch built with CUDA {torch.version.cuda})"


class CudaPrefetcher(FloatBatches):
    """Iterate a loader of ``[uint8 images, labels, ...]`` batches as float batches already on the GPU.

    :class:`~packlab.loaders.batching.FloatBatches` with the copy and conversion moved
    ahead of the training loop.

    Up to ``depth`` batches are on their way at any time: each is copied to ``device``
    (non-blocking, from pinned memory) and converted there (``/ 255``, then normalised
    with ``mean``/``std`` if given) on a side stream, while the training loop computes on
    the current stream. Batches that arrive unpinned are pinned here first (one more
    copy; ``DataLoader(pin_memory=True)`` does it in its own thread instead).
    """

    def __init__(self, loader, device="cuda", mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, depth: int = 2):
        if depth < 1:
            raise ValueError("depth must be at least 1")
        super().__init__(loader, torch.device(device), mean, std)
        self.depth = depth

    def __iter__(self):
        if not torch.cuda.is_available():
            raise RuntimeError(f"CudaPrefetcher needs a CUDA device, and there is none: {cuda_status()}")
        copy_stream = torch.cuda.Stream(self.device)
        mean = None if self.mean is None else torch.tensor(self.mean, device=self.device)
        std = None if self.std is None else torch.tensor(self.std, device=self.device)
        batches = iter(self.loader)
        pending: collections.deque = collections.deque()

        def issue() -> bool:
            """Start moving the next batch to the GPU; False at the end of the epoch."""
            try:
                images, labels, *rest = next(batches)
            except StopIteration:
                return False
            if not images.is_pinned():
                images = images.pin_memory()
            with torch.cuda.stream(copy_stream):
                images = to_float_batch(images, self.device, mean, std, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(copy_stream)
            pending.append((ready, [images, labels, *rest]))
            return True

        for _ in range(self.depth):
            if not issue():
                break
        while pending:
            ready, batch = pending.popleft()
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)  # the GPU, not the host, waits for the copy
            for tensor in batch[:2]:
                tensor.record_stream(current)  # allocated on copy_stream, used on the current stream
            issue()
            yield batch


def nvjpeg_decode_and_resize(encoded: Sequence[bytes], device="cuda", size: int = IMAGE_SIZE) -> torch.Tensor:
    """Decode a list of JPEGs on the GPU (nvJPEG) and resize each to ``size`` x ``size``: a uint8 batch on ``device``.

    The encoded bytes go to ``decode_jpeg`` as CPU tensors (it copies them over itself);
    images of different sizes come back as a list. torchvision's v2 resize of a uint8
    tensor on the GPU goes through float32 and rounds back to uint8.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    from packlab.decode import resize_uint8  # imports torchvision: only when decoding on the GPU

    tensors = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in encoded]
    images = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    for i, image in enumerate(images):
        out[i] = image if image.shape[-2:] == (size, size) else resize_uint8(image, size)
    return out


def gpu_decode_rate(encoded: Sequence[bytes], batch_size: int = 64, rounds: int = 3) -> list[float]:
    """Images/s of :func:`nvjpeg_decode_and_resize` over ``encoded`` in batches, ``rounds`` times (after a warm-up)."""
    nvjpeg_decode_and_resize(encoded[:batch_size])  # the first call initialises nvJPEG
    torch.cuda.synchronize()
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(0, len(encoded), batch_size):
            nvjpeg_decode_and_resize(encoded[i:i + batch_size])
        torch.cuda.synchronize()
        rates.append(len(encoded) / (time.perf_counter() - start))
    return rates


def prefetched_rate(loader, device="cuda", mean=None, std=None, step=None) -> float:
    """Images/s of one epoch of ``loader`` through a :class:`CudaPrefetcher`, ``step(images)`` on each batch.

    The clock stops after the GPU has finished (``synchronize``), so queued work counts.
    """
    start, images = time.perf_counter(), 0
    for batch in CudaPrefetcher(loader, device, mean, std):
        if step is not None:
            step(batch[0])
        images += len(batch[0])
    torch.cuda.synchronize()
    return images / (time.perf_counter() - start)
