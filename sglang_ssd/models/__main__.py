"""Entry point for `python -m sglang_ssd.models`."""

from .cli import main

raise SystemExit(main())
