"""The fine-tuning half of `make demo`: GLUE tasks from $GLUE_DIR (or TFDS), then the results table.

  python scripts/demo_finetune.py --init demo_out/bert_tiny --glue_dir ../shared/data/glue

Uses the GLUE tasks found in the official-layout folder; without one, TFDS `glue/<task>` when the
network allows fetching it; otherwise it says in one line what it skipped and why, and exits 0 so
that the rest of the demo stands.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pretrain.glue import tasks as glue  # noqa: E402


def network_allows_tfds(host: str = "dl.fbaipublicfiles.com", timeout: float = 3.0) -> bool:
    """TFDS downloads GLUE from this host; offline, tfds would retry for minutes before failing."""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", required=True, help="the pretrain.train workdir to fine-tune")
    parser.add_argument("--glue_dir", default=os.environ.get("GLUE_DIR", ""))
    parser.add_argument("--tasks", nargs="+", default=["cola", "sst2", "mrpc", "wnli"])
    parser.add_argument("--learning_rate", default="1e-4", help="small BERTs fine-tune best near 1e-4 (Turc et al.)")
    parser.add_argument("--max_train_examples", default="8000", help="caps SST-2's 67k rows for a quick demo")
    parser.add_argument("--output", default="demo_out/glue")
    args = parser.parse_args()

    if args.glue_dir and os.path.isdir(args.glue_dir):
        found = [t for t in args.tasks if os.path.isdir(os.path.join(args.glue_dir, glue.get_task(t).directory))]
        source = ["--source", "dir", "--glue_dir", args.glue_dir]
    elif network_allows_tfds():
        found, source = args.tasks, ["--source", "tfds"]
    else:
        found = []
    if not found:
        print(f"Skipped GLUE fine-tuning: no GLUE data in GLUE_DIR={args.glue_dir or '(unset)'} and no network for "
              "TFDS glue/*; set GLUE_DIR to a folder in the official GLUE layout to fine-tune the demo model.")
        return 0
    command = [sys.executable, os.path.join(REPO, "scripts", "reproduce_glue_table.py"), "--init", args.init,
               "--tasks", *found, "--learning_rates", args.learning_rate, "--seeds", "0",
               "--max_train_examples", args.max_train_examples, "--output", args.output, *source]
    print("Fine-tuning the demo model on " + ", ".join(found) + ": " + " ".join(command[1:]), flush=True)
    return subprocess.call(command, cwd=REPO)


if __name__ == "__main__":
    sys.exit(main())
