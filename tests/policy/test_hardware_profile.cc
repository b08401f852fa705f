#include "policy/hardware_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace flexh2o::policy {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kHardwareDir = std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware";

// A complete, valid profile; tests replace or drop one line of it.
const std::vector<std::string> kLines = {
    "name: test-box",
    "source: written by a test",
    "gpu_mem: 16GiB",
    "cpu_mem: 200GB",
    "disk_mem: 1500000000000",
    "cpu_to_gpu_gbps: 12.89",
    "gpu_to_cpu_gbps: 0.97",
    "disk_to_cpu_gbps: 0.473",
    "cpu_to_disk_gbps: 0.746",
    "gpu_gemm_prefill_tflops: 21.24",
    "gpu_gemm_decode_tflops: 4.3",
    "gpu_attn_prefill_tflops: 9.97",
    "gpu_attn_decode_tflops: 0.079",
    "cpu_gemm_tflops: 0.0123",
    "cpu_attn_decode_tflops: 0.0123",
};

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// kLines with the line of `key` replaced by `line` (dropped when empty).
std::string with(const std::string& key, const std::string& line) {
  std::vector<std::string> out;
  for (const auto& l : kLines) {
    if (l.rfind(key + ":", 0) == 0) {
      if (!line.empty()) out.push_back(line);
    } else {
      out.push_back(l);
    }
  }
  return join(out);
}

std::string error_of(const std::string& text) {
  try {
    load_hardware_yaml(text, "hw.yaml");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// FlexGen's fitted T4 bandwidths and rates (docs/planner.md) in struct units.
void expect_t4_rates(const HardwareProfile& h) {
  EXPECT_DOUBLE_EQ(h.cpu_to_gpu, 12.89e9);
  EXPECT_DOUBLE_EQ(h.gpu_to_cpu, 0.97e9);
  EXPECT_DOUBLE_EQ(h.disk_to_cpu, 0.473e9);
  EXPECT_DOUBLE_EQ(h.cpu_to_disk, 0.746e9);
  EXPECT_DOUBLE_EQ(h.gpu_gemm_prefill, 21.24e12);
  EXPECT_DOUBLE_EQ(h.gpu_gemm_decode, 4.3e12);
  EXPECT_DOUBLE_EQ(h.gpu_attn_prefill, 9.97e12);
  EXPECT_DOUBLE_EQ(h.gpu_attn_decode, 0.079e12);
  EXPECT_DOUBLE_EQ(h.cpu_gemm, 0.0123e12);
  EXPECT_DOUBLE_EQ(h.cpu_attn_decode, 0.0123e12);
}

TEST(HardwareProfile, LoadsUnitsAsBytesAndFlops) {
  const HardwareProfile h = load_hardware_yaml(join(kLines), "hw.yaml");
  EXPECT_EQ(h.name, "test-box");
  EXPECT_EQ(h.source, "written by a test");
  EXPECT_EQ(h.gpu_mem, std::int64_t{16} << 30);
  EXPECT_EQ(h.cpu_mem, 200'000'000'000);
  EXPECT_EQ(h.disk_mem, 1'500'000'000'000);
  expect_t4_rates(h);
}

TEST(HardwareProfile, YamlRoundTrips) {
  HardwareProfile h;
  h.name = "odd: name";
  h.source = "measured by flexh2o calibrate on box, 2025-01-01 00:00 UTC";
  h.gpu_mem = 24'567'890'123;  // no unit divides it: written as bytes
  h.cpu_mem = std::int64_t{3} << 40;
  h.disk_mem = 512'000'000;
  h.cpu_to_gpu = 1.0 / 3.0 * 1e10;
  h.gpu_to_cpu = 12.89e9;
  h.disk_to_cpu = 123456789.123;
  h.cpu_to_disk = 7e8;
  h.gpu_gemm_prefill = 3.14159e11;
  h.gpu_gemm_decode = 2.5e10;
  h.gpu_attn_prefill = 9.97e12;
  h.gpu_attn_decode = 1.7e9;
  h.cpu_gemm = 1.23e10;
  h.cpu_attn_decode = 4.56e8;
  const std::string text = hardware_to_yaml(h);
  const HardwareProfile q = load_hardware_yaml(text, "roundtrip");
  EXPECT_EQ(q.name, h.name);
  EXPECT_EQ(q.source, h.source);
  EXPECT_EQ(q.gpu_mem, h.gpu_mem);
  EXPECT_EQ(q.cpu_mem, h.cpu_mem);
  EXPECT_EQ(q.disk_mem, h.disk_mem);
  EXPECT_DOUBLE_EQ(q.cpu_to_gpu, h.cpu_to_gpu);
  EXPECT_DOUBLE_EQ(q.gpu_to_cpu, h.gpu_to_cpu);
  EXPECT_DOUBLE_EQ(q.disk_to_cpu, h.disk_to_cpu);
  EXPECT_DOUBLE_EQ(q.cpu_to_disk, h.cpu_to_disk);
  EXPECT_DOUBLE_EQ(q.gpu_gemm_prefill, h.gpu_gemm_prefill);
  EXPECT_DOUBLE_EQ(q.gpu_gemm_decode, h.gpu_gemm_decode);
  EXPECT_DOUBLE_EQ(q.gpu_attn_prefill, h.gpu_attn_prefill);
  EXPECT_DOUBLE_EQ(q.gpu_attn_decode, h.gpu_attn_decode);
  EXPECT_DOUBLE_EQ(q.cpu_gemm, h.cpu_gemm);
  EXPECT_DOUBLE_EQ(q.cpu_attn_decode, h.cpu_attn_decode);
  // Readable units: exact sizes keep a unit, rates are in GB/s and TFLOP/s.
  EXPECT_THAT(text, HasSubstr("cpu_mem: 3TiB"));
  EXPECT_THAT(text, HasSubstr("disk_mem: 512MB"));
  EXPECT_THAT(text, HasSubstr("gpu_to_cpu_gbps: 12.89\n"));
  EXPECT_THAT(text, HasSubstr("gpu_attn_prefill_tflops: 9.97\n"));
}

// FlexGen's constants in FlexGen's unit, GB = 2^30 bytes (flexgen/utils.py), except the SSD,
// whose bandwidths are the FlexGen paper's (t4-gcp.yaml says why).
TEST(HardwareProfile, T4HasFlexGensFittedConstantsInItsUnits) {
  const HardwareProfile h = load_hardware_file(kHardwareDir + "/t4-gcp.yaml");
  constexpr double kFlexGenGB = 1 << 30;
  EXPECT_EQ(h.name, "t4-gcp");
  EXPECT_THAT(h.source, HasSubstr("FlexGen"));
  EXPECT_EQ(h.gpu_mem, 15 * std::int64_t{1 << 30});
  EXPECT_EQ(h.cpu_mem, 204 * std::int64_t{1 << 30});
  EXPECT_EQ(h.disk_mem, 1500 * std::int64_t{1 << 30});
  // The file keeps 4 significant digits of each converted bandwidth.
  EXPECT_NEAR(h.cpu_to_gpu, 12.89 * kFlexGenGB, 5e-4 * h.cpu_to_gpu);
  EXPECT_NEAR(h.gpu_to_cpu, 0.97 * kFlexGenGB, 5e-4 * h.gpu_to_cpu);
  EXPECT_DOUBLE_EQ(h.disk_to_cpu, 2e9);
  EXPECT_DOUBLE_EQ(h.cpu_to_disk, 1e9);
  EXPECT_DOUBLE_EQ(h.gpu_gemm_prefill, 21.24e12);
  EXPECT_DOUBLE_EQ(h.gpu_gemm_decode, 4.3e12);
  EXPECT_DOUBLE_EQ(h.gpu_attn_prefill, 9.97e12);
  EXPECT_DOUBLE_EQ(h.gpu_attn_decode, 0.079e12);
  EXPECT_DOUBLE_EQ(h.cpu_gemm, 0.0123e12);
  EXPECT_DOUBLE_EQ(h.cpu_attn_decode, 0.0123e12);
  EXPECT_EQ(h.activation_dtype, kernels::DType::F16);  // FlexGen computes in fp16
}

TEST(HardwareProfile, OptionalFieldsLoadCheckAndRoundTrip) {
  const HardwareProfile plain = load_hardware_yaml(join(kLines), "hw.yaml");
  EXPECT_DOUBLE_EQ(plain.memory_safety, 0.9);
  EXPECT_EQ(plain.activation_dtype, kernels::DType::F32);
  EXPECT_EQ(plain.gpu_memory, 0);
  const HardwareProfile h =
      load_hardware_yaml(join(kLines) + "memory_safety: 0.8\nactivation_dtype: bf16\ngpu_memory_gbps: 320\n", "hw.yaml");
  EXPECT_DOUBLE_EQ(h.memory_safety, 0.8);
  EXPECT_EQ(h.activation_dtype, kernels::DType::BF16);
  EXPECT_DOUBLE_EQ(h.gpu_memory, 320e9);
  const HardwareProfile back = load_hardware_yaml(hardware_to_yaml(h), "roundtrip");
  EXPECT_DOUBLE_EQ(back.memory_safety, 0.8);
  EXPECT_EQ(back.activation_dtype, kernels::DType::BF16);
  EXPECT_DOUBLE_EQ(back.gpu_memory, 320e9);
  EXPECT_THAT(error_of(join(kLines) + "memory_safety: 1.5\n"), AllOf(HasSubstr("'memory_safety'"), HasSubstr("at most 1")));
  EXPECT_THAT(error_of(join(kLines) + "memory_safety: 0\n"), HasSubstr("'memory_safety'"));
  EXPECT_THAT(error_of(join(kLines) + "activation_dtype: q4\n"), HasSubstr("'activation_dtype'"));
  EXPECT_THAT(error_of(join(kLines) + "gpu_memory_gbps: -1\n"), HasSubstr("'gpu_memory_gbps'"));
}

TEST(HardwareProfile, MeasuredCurvesRequestsAndOverlapRoundTrip) {
  const HardwareProfile h = load_hardware_yaml(join(kLines) +
                                                   "gpu_attn_decode_tflops_by_len: {1024: 0.005, 64: 0.008}\n"
                                                   "cpu_attn_decode_tflops_by_len: {256: 0.007}\n"
                                                   "disk_read_request_us: 35\ndisk_write_request_us: 50.5\n"
                                                   "disk_rows_write_request_us: 270\ncopy_overlap: 0\n"
                                                   "gpu_attn_decode_read_share: 0.75\n",
                                               "hw.yaml");
  EXPECT_EQ(h.gpu_attn_decode_by_len, (RateCurve{{64, 0.008e12}, {1024, 0.005e12}}));  // sorted
  EXPECT_EQ(h.cpu_attn_decode_by_len, (RateCurve{{256, 0.007e12}}));
  EXPECT_DOUBLE_EQ(h.disk_read_request, 35e-6);
  EXPECT_DOUBLE_EQ(h.disk_write_request, 50.5e-6);
  EXPECT_DOUBLE_EQ(h.disk_rows_write_request, 270e-6);
  EXPECT_EQ(h.copy_overlap, 0);
  EXPECT_EQ(h.gpu_attn_decode_read_share, 0.75);
  EXPECT_EQ(h.cpu_attn_decode_read_share, 0);  // not given: not modelled
  const HardwareProfile back = load_hardware_yaml(hardware_to_yaml(h), "roundtrip");
  EXPECT_EQ(back.gpu_attn_decode_by_len, h.gpu_attn_decode_by_len);
  EXPECT_EQ(back.cpu_attn_decode_by_len, h.cpu_attn_decode_by_len);
  EXPECT_DOUBLE_EQ(back.disk_read_request, h.disk_read_request);
  EXPECT_DOUBLE_EQ(back.disk_write_request, h.disk_write_request);
  EXPECT_DOUBLE_EQ(back.disk_rows_write_request, h.disk_rows_write_request);
  EXPECT_EQ(back.copy_overlap, 0);
  EXPECT_EQ(back.gpu_attn_decode_read_share, 0.75);
  EXPECT_EQ(back.cpu_attn_decode_read_share, 0);
  // Log-log between the points, clamped at the ends.
  EXPECT_NEAR(rate_at(h.gpu_attn_decode_by_len, 256, 0), 0.008e12 * std::pow(0.625, 0.5), 1e3);
  EXPECT_DOUBLE_EQ(rate_at(h.gpu_attn_decode_by_len, 8, 0), 0.008e12);
  EXPECT_DOUBLE_EQ(rate_at({}, 8, 3.0), 3.0);
  EXPECT_THAT(error_of(join(kLines) + "copy_overlap: 1.5\n"), HasSubstr("'copy_overlap'"));
  EXPECT_THAT(error_of(join(kLines) + "cpu_attn_decode_read_share: -0.1\n"), HasSubstr("'cpu_attn_decode_read_share'"));
  EXPECT_THAT(error_of(join(kLines) + "disk_read_request_us: 0\n"), HasSubstr("'disk_read_request_us'"));
  EXPECT_THAT(error_of(join(kLines) + "cpu_attn_decode_tflops_by_len: {0: 1}\n"),
              HasSubstr("'cpu_attn_decode_tflops_by_len'"));
}

TEST(HardwareProfile, EveryBundledProfileLoadsAndIsPlausible) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(kHardwareDir)) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const HardwareProfile h = load_hardware_file(e.path().string());
    names.push_back(e.path().stem().string());
    EXPECT_EQ(h.name, e.path().stem().string()) << "a profile's name is its file name";
    EXPECT_FALSE(h.source.empty());
    // Links are slower than a TB/s and compute is below an exaflop: units were not mixed up.
    for (double bw : {h.cpu_to_gpu, h.gpu_to_cpu, h.disk_to_cpu, h.cpu_to_disk}) {
      EXPECT_GT(bw, 1e6);
      EXPECT_LT(bw, 1e12);
    }
    for (double r : {h.gpu_gemm_prefill, h.gpu_gemm_decode, h.gpu_attn_prefill, h.gpu_attn_decode, h.cpu_gemm,
                     h.cpu_attn_decode}) {
      EXPECT_GT(r, 1e6);
      EXPECT_LT(r, 1e16);
    }
    EXPECT_GE(h.gpu_gemm_prefill, h.gpu_gemm_decode) << "decode GEMMs are memory-bound";
    EXPECT_GT(h.gpu_mem, std::int64_t{1} << 30);
    EXPECT_GT(h.cpu_mem, std::int64_t{1} << 30);
    EXPECT_GT(h.disk_mem, std::int64_t{1} << 30);
  }
  for (const char* want : {"t4-gcp", "a100-80g", "h100-pcie", "h100-sxm", "ci-cpu"})
    EXPECT_THAT(names, ::testing::Contains(std::string(want)));
}

TEST(HardwareProfile, BadYamlNamesTheFileAndField) {
  EXPECT_THAT(error_of("gpu_mem: [1"), HasSubstr("hw.yaml: not valid YAML"));
  EXPECT_THAT(error_of("- 1\n- 2\n"), HasSubstr("hw.yaml: expected a mapping"));
  EXPECT_THAT(error_of(""), HasSubstr("hw.yaml: expected a mapping"));
  EXPECT_THAT(error_of(join(kLines) + "gpu_memory: 16GiB\n"), HasSubstr("hw.yaml: unknown field 'gpu_memory'"));
  EXPECT_THAT(error_of(with("cpu_to_disk_gbps", "")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'cpu_to_disk_gbps'"), HasSubstr("missing")));
  EXPECT_THAT(error_of(with("name", "")), AllOf(HasSubstr("hw.yaml"), HasSubstr("'name'"), HasSubstr("missing")));
  EXPECT_THAT(error_of(with("gpu_mem", "gpu_mem: 0")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'gpu_mem'"), HasSubstr("positive")));
  EXPECT_THAT(error_of(with("gpu_mem", "gpu_mem: -16GiB")), AllOf(HasSubstr("hw.yaml"), HasSubstr("'gpu_mem'")));
  EXPECT_THAT(error_of(with("disk_mem", "disk_mem: 15 parsecs")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'disk_mem'"), HasSubstr("not a size")));
  EXPECT_THAT(error_of(with("cpu_mem", "cpu_mem: [1, 2]")), AllOf(HasSubstr("hw.yaml"), HasSubstr("'cpu_mem'")));
  EXPECT_THAT(error_of(with("gpu_gemm_decode_tflops", "gpu_gemm_decode_tflops: 0")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'gpu_gemm_decode_tflops'"), HasSubstr("positive")));
  EXPECT_THAT(error_of(with("disk_to_cpu_gbps", "disk_to_cpu_gbps: -0.5")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'disk_to_cpu_gbps'"), HasSubstr("positive")));
  EXPECT_THAT(error_of(with("cpu_gemm_tflops", "cpu_gemm_tflops: .nan")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'cpu_gemm_tflops'")));
  EXPECT_THAT(error_of(with("cpu_to_gpu_gbps", "cpu_to_gpu_gbps: fast")),
              AllOf(HasSubstr("hw.yaml"), HasSubstr("'cpu_to_gpu_gbps'"), HasSubstr("must be a number")));
  EXPECT_EQ(error_of(join(kLines)), "no error");
}

TEST(HardwareProfile, FileErrorsNameThePath) {
  const std::string missing = kHardwareDir + "/no-such-machine.yaml";
  try {
    load_hardware_file(missing);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing));
  }
  const auto path = std::filesystem::temp_directory_path() / ("flexh2o-hw-" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << with("gpu_attn_decode_tflops", "gpu_attn_decode_tflops: 0");
  }
  try {
    load_hardware_file(path.string());
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path.string()), HasSubstr("'gpu_attn_decode_tflops'")));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace flexh2o::policy
