"""pretrain/runtime/hlo_report.py: the kernels of an optimized HLO module, their bytes and run counts, and the report's
groups (bf16/f32 converts, layout changes), on a module written here and on one XLA compiled."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pretrain.runtime import hlo_report

MODULE = """HloModule step

%fused_convert (p: bf16[4,8]) -> f32[4,8] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %c = f32[4,8]{1,0} convert(%p)
}

%body (t: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %t = (s32[], bf16[4,8]{1,0}) parameter(0)
  %x = bf16[4,8]{1,0} get-tuple-element(%t), index=1
  %convert_fusion.3 = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_convert, metadata={op_name="jit(step)/while/body/layer/mlp/convert_element_type"}
  %copy.1 = f32[8,4]{0,1} copy(%convert_fusion.3)
  ROOT %r = (s32[], bf16[4,8]{1,0}) tuple(%t, %x)
}

%body2 (t: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %t = (s32[], bf16[4,8]{1,0}) parameter(0)
  %x = bf16[4,8]{1,0} get-tuple-element(%t), index=1
  %negate.9 = bf16[4,8]{1,0} negate(%x)
  ROOT %r = (s32[], bf16[4,8]{1,0}) tuple(%t, %negate.9)
}

%cond (t: (s32[], bf16[4,8])) -> pred[] {
  %t = (s32[], bf16[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[]{:T(128)} constant(7)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: bf16[4,8], b: f32[16]) -> f32[16] {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = f32[16]{0} parameter(1)
  %w = (s32[], bf16[4,8]{1,0}) while(%a), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %w2 = (s32[], bf16[4,8]{1,0}) while(%a), condition=%cond, body=%body2
  %copy-start.1 = (f32[16]{0}, f32[16]{0}) copy-start(%b)
  %copy-done.1 = f32[16]{0} copy-done(%copy-start.1)
  ROOT %add.2 = f32[16]{0} add(%b, %b)
}
"""


def test_kernels_bytes_and_trip_counts_of_a_module():
    ops = {op.name: op for op in hlo_report.parse(MODULE)}
    # not the fused computation's own instructions; an async copy once (its start)
    assert set(ops) == {"convert_fusion.3", "copy.1", "negate.9", "copy-start.1", "add.2"}
    assert ops["negate.9"].runs == 7  # no known_trip_count (TPU programs): the condition's bound
    convert, copy, add = ops["convert_fusion.3"], ops["copy.1"], ops["add.2"]
    assert (convert.out_bytes, convert.in_bytes, convert.runs) == (128, 64, 12)  # f32[4,8] out, bf16[4,8] in
    assert convert.moved == 12 * 192 and convert.kind == "convert_fusion" and convert.source.endswith("convert_element_type")
    assert (copy.out_bytes, copy.in_bytes, copy.runs) == (128, 128, 12)
    assert (add.out_bytes, add.in_bytes, add.runs) == (64, 128, 1)
    assert hlo_report.is_precision_change(convert) and not hlo_report.is_precision_change(copy)
    assert hlo_report.is_layout_change(copy) and not hlo_report.is_layout_change(add)


def test_report_groups_what_it_found():
    report = hlo_report.summarize(hlo_report.parse(MODULE))
    assert report.startswith("5 kernels")
    assert "bf16 <-> f32 converts: 1 kernels" in report and "copies and transposes: 2 kernels" in report


def test_a_compiled_programs_bytes_count_its_arrays():
    def step(x, w):  # [64, 256] . [256, 512] -> sum
        return jnp.sum(jnp.tanh(x @ w))
    text = jax.jit(step).lower(jnp.ones((64, 256)), jnp.ones((256, 512))).compile().as_text()
    ops = hlo_report.parse(text)
    assert ops and sum(op.moved for op in ops) >= 4 * (64 * 256 + 256 * 512)  # at least the matmul's operands
    assert any(op.in_bytes >= 4 * 256 * 512 for op in ops)  # the kernel that reads w


TPU_MODULE = """HloModule tpu_step

%negate_it (p: bf16[64,128]) -> bf16[64,128] {
  %p = bf16[64,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  ROOT %n = bf16[64,128]{1,0:T(8,128)(2,1)} negate(%p)
}

ENTRY %main (a: bf16[64,128]) -> bf16[64,128] {
  %a = bf16[64,128]{1,0:T(8,128)(2,1)} parameter(0)
  %copy-start = (bf16[64,128]{1,0:T(8,128)(2,1)}, bf16[64,128]{1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) copy-start(%a)
  %copy-done = bf16[64,128]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  %slice-start = ((bf16[64,128]{1,0:T(8,128)(2,1)}), bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, s32[]{:S(2)}) slice-start(%a), slice={[0:16], [0:128]}
  %slice-done = bf16[16,128]{1,0:T(8,128)(2,1)S(1)} slice-done(%slice-start)
  ROOT %fusion.1 = bf16[64,128]{1,0:T(8,128)(2,1)} fusion(%copy-done), kind=kLoop, calls=%negate_it, backend_config={"window_config":{"estimated_cycles":"3000"}}
}
"""


def test_on_chip_buffers_and_async_copies_count_only_their_hbm_traffic():
    ops = {op.name: op for op in hlo_report.parse(TPU_MODULE)}
    whole, slice_ = 64 * 128 * 2, 16 * 128 * 2
    # the prefetch into VMEM (S(1)) reads the HBM array once and writes no HBM; its tuple's operand is not a write
    assert (ops["copy-start"].in_bytes, ops["copy-start"].out_bytes) == (whole, 0)
    assert (ops["slice-start"].in_bytes, ops["slice-start"].out_bytes) == (slice_, 0)  # its slice, not the array
    fusion = ops["fusion.1"]
    assert (fusion.in_bytes, fusion.out_bytes, fusion.cycles) == (0, whole, 3000)  # reads VMEM, writes HBM


def test_the_estimate_sums_libtpus_cycles_and_the_bytes_of_kernels_without_them():
    ops = hlo_report.parse(TPU_MODULE)
    clock, bandwidth = 1e9, 1e6
    expected = 3000 / clock + (64 * 128 * 2 + 16 * 128 * 2) / bandwidth
    assert abs(hlo_report.estimated_seconds(ops, clock, bandwidth) - expected) < 1e-12
    assert hlo_report.estimated_seconds(hlo_report.parse(MODULE), clock, bandwidth) is None  # no estimates: no sum


def test_the_report_lists_the_slowest_kernels_given_the_clock():
    ops = hlo_report.parse(TPU_MODULE)
    report = hlo_report.summarize(ops, clock_hz=1e6).splitlines()  # 3,000 cycles at 1 MHz: 3 ms
    slowest = report.index("slowest by libtpu's estimates (3.0 ms in 1 kernels):")
    assert report[slowest + 1].split()[:3] == ["3.00", "ms", "x1"] and "fusion.1" in report[slowest + 1]
    assert not any(line.startswith("slowest") for line in hlo_report.summarize(ops).splitlines())  # no clock


NESTED_MODULE = """HloModule accumulate

%layer (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%t), index=1
  %negate.1 = f32[8]{0} negate(%x)
  ROOT %r = (s32[], f32[8]{0}) tuple(%t, %negate.1)
}

%micro_batch (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %layers = (s32[], f32[8]{0}) while(%t), condition=%cond, body=%layer, backend_config={"known_trip_count":{"n":"12"}}
  ROOT %abs.1 = (s32[], f32[8]{0}) tuple(%layers)
}

%cond (t: (s32[], f32[8])) -> pred[] {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: (s32[], f32[8])) -> (s32[], f32[8]) {
  %a = (s32[], f32[8]{0}) parameter(0)
  ROOT %steps = (s32[], f32[8]{0}) while(%a), condition=%cond, body=%micro_batch, backend_config={"known_trip_count":{"n":"4"}}
}
"""


def test_a_loop_inside_a_loop_runs_its_body_the_product_of_their_trip_counts():
    ops = {op.name: op for op in hlo_report.parse(NESTED_MODULE)}
    assert ops["negate.1"].runs == 4 * 12  # gradient accumulation's 4 micro-batches x 12 scanned layers
