"""`python -m kvparity ...` is the `kvparity` command (the supervisor starts its child this way).

The guard matters: engines that start worker processes with multiprocessing's spawn (vLLM) re-import
the main module in each worker, which must not start another kvparity."""

from kvparity.cli import console_main

if __name__ == "__main__":
    console_main()
