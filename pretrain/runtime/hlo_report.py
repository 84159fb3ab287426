"""What a compiled program moves through memory: its optimized HLO's operations by the bytes each reads and writes.

XLA's cost analysis gives one number for a whole step ("bytes accessed"); this takes the optimized HLO text
(`compiled.as_text()`) apart: every operation that runs as a kernel of its own (each fusion, copy, convert,
all-gather, custom call ...: the instructions of the entry computation and of while-loop bodies, not the
instructions inside a fusion), its output bytes, the bytes of its operands, and how often it runs (a scanned
stack's body runs `known_trip_count` times). `summarize` groups them:

  largest     the operations that move the most bytes, with their shapes and the op they came from
  kinds       bytes per kind (the fusion's name without its number: `loop_convert_fusion`, `copy`, ...)
  converts    operations that turn bf16 into f32 or back (float32 copies of bf16 tensors)
  transposes  copies and transposes (layout changes)

Bytes are per device (the HLO is the per-device program after partitioning).
"""
from __future__ import annotations

import collections
import dataclasses
import re

_ARRAY = re.compile(r"\b(pred|s4|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2|f16|bf16|f32|f64|c64|c128)\[([0-9,]*)\]"
                    r"(\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")  # a layout's memory space other than 0 (HBM): VMEM, SMEM, sync flags
_BYTES = {"pred": 1, "s4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s+(ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*?)\)(.*)$")
_CALLED = re.compile(r"(?:calls|to_apply|condition|select|scatter|branch_computations)=\{?%([\w.\-]+)")
_BODY = re.compile(r"body=%([\w.\-]+)")
_CONDITION = re.compile(r"condition=%([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BOUND = re.compile(r"s32\[\]\S* constant\((\d+)\)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


@dataclasses.dataclass
class Op:
    name: str
    opcode: str
    shape: str         # the output's type, e.g. bf16[32,128,768]{2,1,0}
    out_bytes: int
    in_bytes: int
    runs: int          # times per step (a while body's trip count)
    source: str        # the JAX op it came from (metadata op_name), shortened
    in_types: tuple[str, ...]
    cycles: int | None = None  # libtpu's estimate for one run (backend_config estimated_cycles), if it gives one

    @property
    def moved(self) -> int:
        return (self.out_bytes + self.in_bytes) * self.runs

    @property
    def kind(self) -> str:
        return re.sub(r"\.\d+$", "", self.name) if self.opcode == "fusion" else self.opcode


def array_bytes(text: str) -> int:
    """Bytes of every array type in `text` that lives in device memory (HBM): a tuple's elements summed, arrays
    whose layout puts them in on-chip memory (`S(1)`, a TPU's VMEM) left out, since moving them costs no HBM
    bandwidth."""
    return sum(size for size, in_hbm in arrays(text) if in_hbm)


def arrays(text: str) -> list[tuple[int, bool]]:
    """(bytes, in HBM) of every array type in `text`, in order."""
    return [(_BYTES[dtype] * _prod(dims), not _ON_CHIP.search(layout)) for dtype, dims, layout in _ARRAY.findall(text)]


def _prod(dims: str) -> int:
    out = 1
    for d in filter(None, dims.split(",")):
        out *= int(d)
    return out


def parse(hlo: str) -> list[Op]:
    """The operations that run as kernels of their own, from an optimized HLO module's text."""
    computations, order = _computations(hlo)
    nested = {called for lines in computations.values() for line in lines for called in _CALLED.findall(line)}
    runs = {name: 1 for name in order if name not in nested}
    # while bodies run their trip count times, nested loops multiplied: callers first (a module's text defines every
    # computation before the ones that call it, ENTRY last), so a loop's own count is known when its body is read
    for name in reversed(order):
        for line in computations[name]:
            body = _BODY.search(line)
            if body:
                runs[body.group(1)] = runs.get(name, 1) * _trip_count(line, computations)
    ops = []
    for name in order:
        if name in runs:
            ops += _kernels(computations[name], runs[name], computations)
    return ops


def _trip_count(while_line: str, computations: dict[str, list[str]]) -> int:
    """XLA's known_trip_count where the backend records it (CPU, GPU), else the loop condition's bound: a scan's
    condition compares its counter, from 0, with one s32 constant (TPU programs carry no trip count)."""
    trips = _TRIPS.search(while_line)
    if trips:
        return int(trips.group(1))
    condition = _CONDITION.search(while_line)
    bounds = [int(b) for line in computations.get(condition.group(1) if condition else "", [])
              for b in _BOUND.findall(line)]
    return max(bounds, default=1)


def _computations(hlo: str) -> tuple[dict[str, list[str]], list[str]]:
    computations, order, current = {}, [], None
    for line in hlo.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = match.group(2)
            computations[current], order = [], order + [current]
        elif current and line.strip() == "}":
            current = None
        elif current:
            computations[current].append(line)
    return computations, order


def _kernels(lines: list[str], runs: int, computations: dict[str, list[str]]) -> list[Op]:
    sizes, types, ops = {}, {}, []
    for line in lines:
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        _, name, shape, opcode, operands, rest = match.groups()
        sizes[name], types[name] = array_bytes(shape), shape
        if opcode in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
                      "conditional", "after-all", "partition-id", "replica-id") or opcode.endswith("-done"):
            continue  # no kernel of their own; an async op's bytes count once, at its -start
        inputs = re.findall(r"%([\w.\-]+)", operands)
        reads = [sizes.get(i, 0) for i in inputs]
        called = re.search(r"calls=%([\w.\-]+)", rest)
        sliced = _sliced_parameters(called.group(1), computations) if opcode == "fusion" and called else {}
        written = sizes[name]
        for index, (read, write) in sliced.items():  # a slice of a stacked buffer: its bytes, not the buffer's
            if index < len(reads) and reads[index]:  # (an operand in on-chip memory reads no HBM at all)
                written -= reads[index] - write if write is not None else 0
                reads[index] = read
        if opcode.endswith("-start"):
            written, reads = _async_bytes(opcode, shape, reads)
        source, cycles = _OP_NAME.search(rest), _CYCLES.search(rest)
        ops.append(Op(name, opcode, shape.split("{")[0], max(written, 0), sum(reads), runs,
                      _shorten(source.group(1)) if source else "", tuple(types.get(i, "") for i in inputs),
                      int(cycles.group(1)) if cycles and int(cycles.group(1)) > 0 else None))
    return ops


def _async_bytes(opcode: str, shape: str, reads: list[int]) -> tuple[int, list[int]]:
    """(HBM bytes written, read) of an async op's start, whose output is (its operands, its results, a context):
    the operands are read (a slice-start reads only its slice) and the results written; the tuple's copy of the
    operands is the same buffer, not a write."""
    results = [(size, in_hbm) for size, in_hbm in arrays(shape)[len(reads):] if size > 4]  # not the context scalar
    written = sum(size for size, in_hbm in results if in_hbm)
    if opcode == "slice-start":
        reads = [sum(size for size, _ in results)] if any(reads) else [0]
    return written, reads


def _sliced_parameters(computation: str, computations: dict[str, list[str]]) -> dict[int, tuple[int, int | None]]:
    """Parameters of a fused computation that it only slices: {index: (bytes read, bytes written in place or
    None)}. A dynamic-slice reads its slice (also inside a nested fusion); a dynamic-update-slice of a parameter
    writes the update into that buffer in place (a scan's stacked activations, one layer per iteration)."""
    params, users, sizes = {}, collections.defaultdict(list), {}
    for line in computations.get(computation, []):
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        _, name, shape, opcode, operands, rest = match.groups()
        sizes[name] = array_bytes(shape)
        inputs = re.findall(r"%([\w.\-]+)", operands)
        if opcode == "parameter":
            params[name] = int(operands)
        called = re.search(r"calls=%([\w.\-]+)", rest) if opcode == "fusion" else None
        for position, used in enumerate(inputs):
            users[used].append((opcode, position, name, inputs, called.group(1) if called else None))
    out = {}
    for name, index in params.items():
        reads = [_slice_read(use, sizes, computations) for use in users.get(name, [])]
        uses = users.get(name, [])
        if uses and all(r is not None for r in reads):
            out[index] = (sum(reads), None)
        elif len(uses) == 1 and uses[0][0] == "dynamic-update-slice" and uses[0][1] == 0:
            out[index] = (0, sizes.get(uses[0][3][1], 0))
    return out


def _slice_read(use: tuple, sizes: dict[str, int], computations: dict[str, list[str]]) -> int | None:
    """Bytes a use of a parameter reads when it only slices it, else None."""
    opcode, position, user, _, called = use
    if opcode == "dynamic-slice" and position == 0:
        return sizes[user]
    if called:
        nested = _sliced_parameters(called, computations).get(position)
        return nested[0] if nested and nested[1] is None else None
    return None


def _shorten(op_name: str) -> str:
    """'jit(train_step)/while/body/.../bert/layer/attention/query/dot_general' -> its last four parts."""
    return "/".join(op_name.split("/")[-4:])


def estimated_seconds(ops: list[Op], clock_hz: float, hbm_bandwidth: float, custom_call_seconds: float = 0.0
                      ) -> float | None:
    """A step's time as the sum of its kernels', each run as often as it runs: libtpu's own estimate where the
    compiled HLO carries one (`estimated_cycles` at the chip's clock: it sees the matrix and vector units and the
    kernel's memory traffic), else the kernel's HBM bytes at the chip's bandwidth (async copies and slices,
    collectives, random-bit generators; as if none overlapped the rest). Custom calls (Pallas kernels) take the
    longer of their bytes' time and `custom_call_seconds` (their matmuls at the chip's peak). None: no kernel
    carries an estimate (not a TPU program). Kernels run one after another on a TensorCore, so the sum is the
    step, but for the overlap it leaves out and the collectives' own bandwidth."""
    if not any(op.cycles for op in ops):
        return None
    estimated = sum(op.runs * op.cycles / clock_hz for op in ops if op.cycles)
    custom_bytes = sum(op.moved for op in ops if not op.cycles and op.opcode == "custom-call")
    other_bytes = sum(op.moved for op in ops if not op.cycles and op.opcode != "custom-call")
    return estimated + other_bytes / hbm_bandwidth + max(custom_bytes / hbm_bandwidth, custom_call_seconds)


def is_precision_change(op: Op) -> bool:
    """bf16 in, f32 out or the reverse (a float32 copy of a bf16 tensor, or its way back)."""
    out_dtype = op.shape.split("[")[0]
    in_dtypes = {t.split("[")[0] for t in op.in_types if t}
    return "convert" in op.kind and ({out_dtype} | in_dtypes) >= {"bf16", "f32"}


def is_layout_change(op: Op) -> bool:
    return op.opcode in ("copy", "transpose") or any(w in op.kind for w in ("copy", "transpose"))


def summarize(ops: list[Op], top: int = 15, clock_hz: float | None = None) -> str:
    """A plain-text report: totals, the largest operations, bytes per kind, precision and layout changes; with the
    chip's clock, first the slowest kernels by libtpu's estimates (each as often as it runs)."""
    total = sum(op.moved for op in ops)
    lines = [f"{len(ops)} kernels, {total / 2**30:.2f} GiB moved per step per device"]
    timed = sorted(((op.runs * op.cycles / clock_hz, op) for op in ops if op.cycles and clock_hz),
                   key=lambda pair: -pair[0])
    if timed:
        total_ms = sum(seconds for seconds, _ in timed) * 1e3
        lines.append(f"\nslowest by libtpu's estimates ({total_ms:.1f} ms in {len(timed)} kernels):")
        for seconds, op in timed[:top]:
            lines.append(f"  {seconds * 1e3:9.2f} ms  x{op.runs:<3d} {op.name:32s} {op.shape:28s} {op.source}")

    def table(title: str, chosen: list[Op]) -> None:
        moved = sum(op.moved for op in chosen)
        lines.append(f"\n{title}: {len(chosen)} kernels, {moved / 2**30:.3f} GiB ({moved / max(total, 1):.1%})")
        for op in sorted(chosen, key=lambda o: -o.moved)[:top]:
            lines.append(f"  {op.moved / 2**20:10.1f} MiB  x{op.runs:<3d} {op.name:32s} {op.shape:28s} {op.source}")
    table("largest", ops)
    kinds = collections.Counter()
    for op in ops:
        kinds[op.kind] += op.moved
    lines.append("\nbytes per kind:")
    lines += [f"  {moved / 2**30:8.3f} GiB  {kind}" for kind, moved in kinds.most_common(top)]
    table("bf16 <-> f32 converts", [op for op in ops if is_precision_change(op)])
    table("copies and transposes", [op for op in ops if is_layout_change(op)])
    return "\n".join(lines)
