"""Local copies of Hugging Face Hub dataset repositories, written offline for the tests: parquet files per config
and split (<config>/<split>-00000-of-00001.parquet) and the README.md whose `configs:` block maps them, which
`load_dataset(folder, config)` reads as it reads the repository on the Hub; a corpus as a folder of data files."""
from __future__ import annotations

import os


def write_hub_repo(folder, configs: dict[str, dict[str, object]], card: bool = True) -> str:
    """configs: config name -> split name -> a `datasets.Dataset` or a `pyarrow.Table` (its features kept in the
    parquet's metadata, as the Hub's parquet files keep them). -> the folder. card=False: no README.md (a folder per
    config, its files named by split, and nothing that maps them)."""
    import pyarrow.parquet as pq
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        lines += [f"- config_name: {name}", "  data_files:"]
        for split, table in splits.items():
            path = os.path.join(folder, name, f"{split}-00000-of-00001.parquet")
            if hasattr(table, "to_parquet"):
                table.to_parquet(path)
            else:
                pq.write_table(table, path)
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    if card:
        with open(os.path.join(folder, "README.md"), "w") as f:
            f.write("\n".join(lines + ["---", ""]))
    return str(folder)


def offline_hub(monkeypatch, cache_dir) -> None:
    """No network for datasets and huggingface_hub, and load_dataset's Arrow cache in cache_dir."""
    import datasets
    import huggingface_hub
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache_dir))  # the commands the tests start
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_hub_folder(folder, documents: list[list[str]], files: int = 2, fmt: str = "parquet") -> str:
    """The documents as a Hub repository's data files (data/train-0000k-of-0000n.parquet, or .jsonl with
    fmt="json"): one row per document, its lines joined by newlines, beside an `id` column."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    per_file = -(-len(documents) // files)
    for k in range(files):
        rows = [{"id": k * per_file + i, "text": "\n".join(document)}
                for i, document in enumerate(documents[k * per_file:(k + 1) * per_file])]
        path = os.path.join(folder, "data", f"train-{k:05d}-of-{files:05d}")
        if fmt == "json":
            with open(path + ".jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("text", pa.string())])),
                           path + ".parquet")
    return str(folder)
