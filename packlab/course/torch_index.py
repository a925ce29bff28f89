"""Can this machine reach PyTorch's own wheel index? ``make setup`` asks before it installs a CPU-only torch.

PyPI's Linux torch comes with 3.6 GB of CUDA libraries the course never uses; PyTorch's
CPU wheels (``https://download.pytorch.org/whl/cpu``) leave them out, so ``make setup``
takes those on Linux (``TORCH_BACKEND=cpu``, uv's ``--torch-backend``). Some networks
reach PyPI only (a university proxy, this course's own test machine). There ``make
setup`` says so and installs PyPI's build instead, and records why in
``<environment>/.torch-backend``, which ``make doctor`` reads::

    python3 -m packlab.course.torch_index cpu     # exit 0: reachable; 1: not, and why
    python3 -m packlab.course.torch_index --index-url cpu   # the index's address (make wheelhouse)

Standard library only: it runs with the machine's ``python3`` before the environment exists.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

#: PyTorch's wheel indexes, one per backend: ``<INDEX>/<backend>/`` (``$PACKLAB_TORCH_INDEX`` names
#: another, for a site's mirror or the tests).
INDEX = os.environ.get("PACKLAB_TORCH_INDEX", "https://download.pytorch.org/whl")
#: Seconds to wait for the index before calling it unreachable.
TIMEOUT_S = 15


def index_url(backend: str) -> str:
    """The page uv reads torch's CPU (or CUDA, ``cu130``, ...) wheels from."""
    return f"{INDEX}/{backend}/torch/" if backend != "auto" else f"{INDEX}/"


def unreachable_reason(backend: str, timeout: float = TIMEOUT_S) -> str | None:
    """None when ``backend``'s index answers, else why not (the error, in words)."""
    try:
        with urllib.request.urlopen(index_url(backend), timeout=timeout) as response:
            response.read(1)
        return None
    except urllib.error.HTTPError as exc:
        return f"{index_url(backend)} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{index_url(backend)} is not reachable from here ({reason})"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--index-url"]:  # make wheelhouse: the index pip downloads torch from
        print(f"{INDEX}/{args[1] if len(args) > 1 else 'cpu'}")
        return 0
    backend = args[0] if args else "cpu"
    reason = unreachable_reason(backend)
    if reason is None:
        print(f"PyTorch's {backend} index is reachable: {index_url(backend)}")
        return 0
    print(reason)
    return 1


if __name__ == "__main__":
    sys.exit(main())
