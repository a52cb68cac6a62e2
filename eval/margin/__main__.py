"""`python -m eval.margin`: see `eval.margin.cli`."""

from eval.margin.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
