#include "engine/runtime/machine_profile.h"

#include <sys/statvfs.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "engine/runtime/cgroup_memory.h"
#include "engine/model/embedded.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

std::int64_t cgroup_headroom() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory_headroom(text.str(), "/sys/fs/cgroup").value_or(std::numeric_limits<std::int64_t>::max());
}

// The free space where the offload directory goes; one not yet made goes into its nearest
// existing ancestor.
std::int64_t free_disk(const std::string& dir) {
  fs::path p = fs::absolute(dir.empty() ? fs::temp_directory_path() : fs::path(dir));
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs s {};
  if (::statvfs(p.c_str(), &s) != 0) return 0;
  return static_cast<std::int64_t>(s.f_bavail) * static_cast<std::int64_t>(s.f_frsize);
}

}  // namespace

policy::HardwareProfile hardware_profile(const std::string& name_or_path) {
  for (const auto& e : embedded_hardware_profiles())
    if (e.name == name_or_path) return policy::load_hardware_yaml(std::string(e.yaml), "configs/hardware/" + name_or_path + ".yaml");
  if (!fs::exists(name_or_path)) {
    std::string known;
    for (const auto& e : embedded_hardware_profiles()) known += (known.empty() ? "" : ", ") + std::string(e.name);
    throw std::invalid_argument("hardware profile '" + name_or_path + "': no such file and no built-in profile of that name (" +
                                known + ")");
  }
  return policy::load_hardware_file(name_or_path);
}

std::int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::int64_t available = std::numeric_limits<std::int64_t>::max();
  for (std::string key; in >> key;) {
    std::int64_t kib = 0;
    in >> kib;
    if (key == "MemAvailable:") available = kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::min(available, cgroup_headroom());
}

namespace {

// A GEMM of m rows (up to max_rows) over an f16 matrix of 8192 x 4096 (64 MiB: larger than a
// CPU's last-level cache, as a large model's weights are), timed in the compute dtype the engine
// runs m rows in, with the matrix held as a run holds it there (Backend::gemm_weight_dtype: bf16
// on a GPU) and its input as a run hands it over (bf16 under bf16 compute where the backend
// takes bf16 GEMM inputs: no rounding pass).
class DecodeGemm {
 public:
  static constexpr std::int64_t kN = 8192, kK = 4096;
  DecodeGemm(kernels::Backend& be, std::int64_t max_rows)
      : be_(be),
        w_(be, static_cast<std::size_t>(kWeightBytes)),
        x_(be, static_cast<std::size_t>(max_rows * kK) * sizeof(float)),
        y_(be, static_cast<std::size_t>(max_rows * kN) * sizeof(float)) {
    const std::vector<std::uint16_t> w(static_cast<std::size_t>(kN * kK), 0x2e66);  // 0.1 in f16
    be.copy_to_device(w_.data(), w.data(), w_.bytes());
    if (be.gemm_weight_dtype(kernels::DType::F16, kernels::DType::BF16) == kernels::DType::BF16) {
      w_bf16_ = kernels::DeviceBuffer(be, w_.bytes());
      const std::vector<std::uint16_t> held(w.size(), 0x3dcd);  // 0.1 in bf16
      be.copy_to_device(w_bf16_.data(), held.data(), w_bf16_.bytes());
    }
    const std::vector<float> x(x_.bytes() / sizeof(float), 1.0f);
    be.copy_to_device(x_.data(), x.data(), x_.bytes());
    if (be.takes_bf16_gemm_inputs()) {
      x_bf16_ = kernels::DeviceBuffer(be, x.size() * sizeof(std::uint16_t));
      const std::vector<std::uint16_t> x_bf16(x.size(), 0x3f80);  // 1.0 in bf16
      be.copy_to_device(x_bf16_.data(), x_bf16.data(), x_bf16_.bytes());
    }
  }
  static constexpr std::int64_t kWeightBytes = kN * kK * 2;
  static double flops(std::int64_t m) { return 2.0 * static_cast<double>(m * kN * kK); }
  double seconds(std::int64_t m, kernels::DType compute) {
    kernels::GemmArgs a;
    if (compute == kernels::DType::BF16 && be_.takes_bf16_gemm_inputs())
      a.x_bf16 = x_bf16_.as<std::uint16_t>();
    else
      a.x = x_.as<float>();
    a.m = m;
    const kernels::DType held = be_.gemm_weight_dtype(kernels::DType::F16, compute);
    a.w = {held == kernels::DType::BF16 ? w_bf16_.data() : w_.data(), held, kN, kK};
    a.y = y_.as<float>();
    a.compute = compute;
    const auto t0 = std::chrono::steady_clock::now();
    be_.gemm(a);
    be_.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Seconds per row count: the median of a few rounds over every count, after a warm-up round.
  // Interleaved, every point sees the same share of a load that comes and goes (the other
  // processes on the cores), so the curve keeps its shape, and the median drops a round a
  // burst hit (best-of-N took one lucky call per point: the points then came from different
  // loads, e.g. 4 rows measured slower than 1).
  std::vector<double> median_seconds(const std::vector<std::int64_t>& rows, const GemmDtypeAt& dtype_at) {
    constexpr int kRounds = 3;
    std::vector<std::vector<double>> times(rows.size());
    for (int round = 0; round <= kRounds; ++round)
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const double s = seconds(rows[i], dtype_at(rows[i]));
        if (round > 0) times[i].push_back(s);
      }
    std::vector<double> medians;
    for (auto& t : times) {
      std::ranges::nth_element(t, t.begin() + kRounds / 2);
      medians.push_back(t[kRounds / 2]);
    }
    return medians;
  }

 private:
  kernels::Backend& be_;
  kernels::DeviceBuffer w_, x_, y_, w_bf16_, x_bf16_;
};

// The rows this machine's GEMMs are timed at: a CPU's rate levels off by 256 rows; a GPU's
// climbs until thousands (its calls are launch- and read-bound before), and it times them fast.
std::vector<std::int64_t> measured_rows(bool cpu) {
  if (cpu) return {1, 4, 16, 64, 256};
  return {1, 4, 16, 64, 256, 1024, 4096, 16384};
}

// The built-in profile's rate curves brought to this machine as it is now: each is scaled by
// measured / built-in GEMM rate at its rows (up to the last measured; its ratio beyond), so the curves
// keep calibrate's shape and what the engine pays around its GEMMs, at the level a large
// model's GEMMs reach here in the dtype the engine computes them in (the built-in curves come
// from OPT-125M, whose weights stay in cache, on another CPU, unloaded, in fp32).
void scale_to_measured(policy::HardwareProfile& hw, const policy::RateCurve& measured) {
  const policy::RateCurve builtin = hw.gemm_by_rows;
  auto factor = [&](std::int64_t rows) {
    const double x = static_cast<double>(std::min(rows, measured.back().first));
    return policy::rate_at(measured, x, 1) / policy::rate_at(builtin, x, policy::rate_at(measured, x, 1));
  };
  for (policy::RateCurve* curve : {&hw.gemm_by_rows, &hw.layer_by_rows, &hw.head_by_rows})
    for (auto& [rows, rate] : *curve) rate *= factor(rows);
  if (hw.gemm_by_rows.empty()) hw.gemm_by_rows = measured;
  hw.gpu_gemm_decode = policy::rate_at(measured, 16, hw.gpu_gemm_decode);
  hw.gpu_gemm_prefill = measured.back().second;
}

// The GEMM times of one backend kind and dtype per row count, measured once per process: a
// process that runs many jobs (the Python API) plans each without measuring again.
std::vector<double> measured_once(kernels::DeviceKind kind, const std::vector<std::int64_t>& rows,
                                  const GemmDtypeAt& dtype_at, const std::function<std::vector<double>()>& measure) {
  static std::mutex mutex;
  static std::map<std::pair<kernels::DeviceKind, std::vector<kernels::DType>>, std::vector<double>> seconds;
  std::vector<kernels::DType> dtypes;
  for (std::int64_t r : rows) dtypes.push_back(dtype_at(r));
  const std::lock_guard lock(mutex);
  auto [it, fresh] = seconds.try_emplace({kind, dtypes});
  if (fresh) it->second = measure();
  return it->second;
}

}  // namespace

double weight_read_rate(kernels::Backend& be) {
  return static_cast<double>(DecodeGemm::kWeightBytes) /
         DecodeGemm(be, 1).median_seconds({1}, [](std::int64_t) { return kernels::DType::F32; })[0];
}

policy::HardwareProfile this_machine_profile(kernels::Backend& be, const std::string& offload_dir,
                                             const GemmDtypeAt& dtype_at) {
  const bool cpu = be.kind() == kernels::DeviceKind::Cpu;
  const std::string rates = cpu ? "ci-cpu" : "h100-pcie";
  policy::HardwareProfile hw = hardware_profile(rates);
  const std::int64_t memory = available_memory();
  hw.name = "this machine";
  hw.source = "capacities of this machine now, rates of the built-in " + rates + " profile";
  // On the CPU backend both tiers are this RAM: the planner fits them into it together.
  hw.gpu_is_host_memory = cpu;
  hw.gpu_mem = cpu ? memory : be.memory_capacity();
  hw.cpu_mem = memory;
  hw.disk_mem = free_disk(offload_dir);
  const std::vector<std::int64_t> rows = measured_rows(cpu);
  const std::vector<double> seconds = measured_once(be.kind(), rows, dtype_at, [&] {
    return DecodeGemm(be, rows.back()).median_seconds(rows, dtype_at);
  });
  policy::RateCurve measured;
  for (std::size_t i = 0; i < rows.size(); ++i) measured.emplace_back(rows[i], DecodeGemm::flops(rows[i]) / seconds[i]);
  if (hw.gpu_memory == 0) hw.gpu_memory = static_cast<double>(DecodeGemm::kWeightBytes) / seconds[0];
  scale_to_measured(hw, measured);
  std::string points;
  for (std::size_t i = 0; i < rows.size(); ++i)
    points += fmt::format("{}{:.1f} ({})", i ? "/" : "", measured[i].second / 1e9,
                          kernels::dtype_name(dtype_at(rows[i])));
  hw.source += fmt::format("; GEMMs measured now: {} GFLOP/s at {} rows, weights read at {:.1f} GB/s", points,
                           fmt::join(rows, "/"), hw.gpu_memory / 1e9);
  return hw;
}

}  // namespace flexh2o::engine
