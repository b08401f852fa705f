// What a machine can hold and move, for the cost model (FlexGen's constants, docs/planner.md
// "The cost model"): tier capacities, link bandwidths and compute rates. Loaded from
// configs/hardware/*.yaml or written by `flexh2o calibrate`.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace flexh2o::policy {

// A measured rate as a function of one size (rows of a GEMM, cached tokens of attention):
// points ascending in x, read by log-log interpolation and clamped to the ends.
using RateCurve = std::vector<std::pair<std::int64_t, double>>;
// The curve at x, or `fallback` when the curve is empty.
double rate_at(const RateCurve& curve, double x, double fallback);
// A rate by rows (a GEMM, a decoder layer, the head) at x: as rate_at within the curve; past
// its last point it goes on along the last segment's log-log slope (taken within [0, 1]: a
// rate never falls with rows, nor grows faster than they do) up to `ceiling`, never below the
// last point. A GPU's curve measured to a few hundred rows is still climbing there (the time
// of a call is the weights' read and the launch, not the arithmetic, until the rows fill the
// card): clamping it priced every row beyond as dearly as the last (docs/planner.md).
double rows_rate_at(const RateCurve& curve, double x, double fallback, double ceiling);

struct HardwareProfile {
  std::string name;
  std::string source;  // "measured by flexh2o calibrate on ...", "FlexGen's fitted T4 constants", "datasheet estimate"
  // Capacities in bytes.
  std::int64_t gpu_mem = 0, cpu_mem = 0, disk_mem = 0;
  // The gpu tier is the host memory the cpu tier lives in too (the CPU backend): a plan fits
  // both tiers' items together into the larger of gpu_mem and cpu_mem (the memory; the smaller,
  // when a flag lowers one, limits that tier alone), so that neither has a fixed share of it.
  bool gpu_is_host_memory = false;
  // The fraction of each tier a plan may fill: what allocator slack, fragmentation and the
  // runtime's own buffers leave of the capacities above.
  double memory_safety = 0.9;
  // The dtype the compute device holds activations in (hidden states, GEMM outputs, their
  // staging copies): f32 in flexh2o's engine today, f16 in FlexGen's PyTorch runtime.
  kernels::DType activation_dtype = kernels::DType::F32;
  // Bandwidths in bytes/s.
  double cpu_to_gpu = 0, gpu_to_cpu = 0, disk_to_cpu = 0, cpu_to_disk = 0;
  // Rates in flop/s: dense GEMM and batched attention matmuls, prefill and decode, on the
  // gpu (the compute backend) and on the cpu (cpu_cache_compute attention).
  double gpu_gemm_prefill = 0, gpu_gemm_decode = 0, gpu_attn_prefill = 0, gpu_attn_decode = 0;
  double cpu_gemm = 0, cpu_attn_decode = 0;
  // Optional: measured GEMM rate (flop/s) by rows of the activation matrix. A GEMM's
  // efficiency grows with its rows (batch x tokens); when given, the cost model reads the
  // rate at each policy's rows instead of the two GEMM constants above.
  RateCurve gemm_by_rows;
  // Optional (calibrate --model): the engine's own units of one model by rows, as flop/s of
  // their matrices (2 x elements per row): a decoder layer (attention and MLP units with their
  // norms, biases, activation, residual adds and KV writes; attention over one key) and the
  // output head (final norm, head GEMM and sampling, one row per sequence). A step pays these
  // beyond its GEMMs' arithmetic; when given they replace gemm_by_rows for those terms.
  RateCurve layer_by_rows, head_by_rows;
  // Optional: decode attention rate (flop/s) by cached tokens, on the compute device and on
  // the CPU (cpu_cache_compute); when given they replace the decode attention constants.
  // Short caches pay per-(sequence, head) overheads, long ones outgrow the caches.
  RateCurve gpu_attn_decode_by_len, cpu_attn_decode_by_len;
  // Optional: the share of a decode attention's time that reading its K/V takes, on the compute
  // device and on the CPU (0: not modelled). Where a GPU batch's rows holding one shared prefix
  // read it once (cascade attention, docs/prefix-sharing.md), every member but the one whose
  // read counts saves this share of its attention over the prefix. calibrate derives it from
  // the decode rate with all its sequences reading one prefix once against the plain rate.
  double gpu_attn_decode_read_share = 0, cpu_attn_decode_read_share = 0;
  // Optional: seconds of one small disk request beyond its bytes / bandwidth, with many in
  // flight as the engine issues a KV cache's (sequence, head) pieces: a read; a write of one
  // slot into a partly kept 4 KiB block (read-modify-write); a write of a head's prompt rows,
  // whose partial blocks its neighbours share (the store orders those). 0: not modelled.
  double disk_read_request = 0, disk_write_request = 0, disk_rows_write_request = 0;
  // Optional: seconds of host work per sequence and step under continuous batching, beyond the
  // units' compute: the engine plans the step, samples each slot's token in a call of its own
  // and records it (measured for a model by its first run, calibrate_units.h). 0: not modelled.
  double host_row = 0;
  // The fraction of a cpu<->gpu copy's time that hides behind compute: 1 where a copy engine
  // moves the bytes (a GPU), less where the copies take the cores that compute (the CPU
  // backend's memcpy).
  double copy_overlap = 1;
  // Optional: bytes/s the compute device reads its own memory at (0: not modelled). Every
  // GEMM reads its weight matrix once, so a GEMM over few rows takes at least weight bytes /
  // this rate however fast the arithmetic (decode at a small batch is memory-bound).
  double gpu_memory = 0;
  // Optional: bytes/s of 4-bit groups (2 values per byte) the compute device expands to fp32 (0: not modelled,
  // i.e. free, as on a GPU where it hides behind PCIe). The CPU pays for it per GEMM call
  // and per decode step of a compressed cache.
  double dequant = 0;
  // The rate of a GEMM (`unit` empty: gemm_by_rows) or of a unit (layer_by_rows,
  // head_by_rows) at `rows` (rows_rate_at up to the compute peak, gpu_gemm_prefill), or
  // `fallback` when there is no curve. Past a unit curve's last point, where gemm_by_rows goes
  // on, the unit's rate grows as the GEMM's does from that point (its GEMMs are what grow; a
  // CPU's GEMM curve is flat there while its layer curve still rose a little).
  double rows_rate(const RateCurve& unit, double rows, double fallback) const;
};

// Keys: name, source, gpu_mem/cpu_mem/disk_mem (sizes like "15GiB" or bytes), bandwidths in
// GB/s (cpu_to_gpu_gbps, gpu_to_cpu_gbps, disk_to_cpu_gbps, cpu_to_disk_gbps), rates in
// TFLOP/s (gpu_gemm_prefill_tflops, gpu_gemm_decode_tflops, gpu_attn_prefill_tflops,
// gpu_attn_decode_tflops, cpu_gemm_tflops, cpu_attn_decode_tflops). Every key is required;
// unknown keys and non-positive values are errors naming the file and key. Optional:
// memory_safety (default 0.9, in (0, 1]), gpu_is_host_memory (default false),
// activation_dtype (f32 default, f16 or bf16),
// gpu_memory_gbps, copy_overlap (default 1, in [0, 1]), dequant_gbps (GB/s of q4 input),
// disk_read_request_us, disk_write_request_us, disk_rows_write_request_us, host_row_us, and the curves
// gemm_tflops_by_rows, layer_tflops_by_rows and head_tflops_by_rows {rows: TFLOP/s},
// gpu_attn_decode_tflops_by_len and cpu_attn_decode_tflops_by_len {cached tokens: TFLOP/s},
// gpu_attn_decode_read_share and cpu_attn_decode_read_share (in [0, 1]) (what calibrate
// measures).
HardwareProfile load_hardware_yaml(const std::string& yaml_text, const std::string& source);
HardwareProfile load_hardware_file(const std::string& path);
std::string hardware_to_yaml(const HardwareProfile& h);

}  // namespace flexh2o::policy
