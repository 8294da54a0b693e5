"""``python -m src_dask`` is the ``src-dask`` command line."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
