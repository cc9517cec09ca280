// Hardware profiles for sizing: the few device figures that decide how fast a ZAYA-style model
// trains and decodes (compute units, GEMM tile shapes, peak dense bf16/fp8 throughput, HBM capacity
// and bandwidth, the intra-node topology and the NIC). Built-in profiles come from vendor
// datasheets; a measured profile is the JSON that `zaya bench` writes (schema "zaya.hardware/1"),
// and any field it lacks falls back to the built-in profile of the same device.
//
// Deliberately not here: measuring anything (that is `zaya bench`), multi-NIC or rail topologies,
// clocks and power limits, or sparsity throughput (ZAYA trains dense matmuls).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "sizing/kernel_class.h"

namespace zaya::sizing {

// How GPUs inside one node reach each other.
//  FullyConnected: every GPU has one direct link to each peer (MI300X: 7 Infinity Fabric links). A
//    collective over n GPUs of the node drives only the n-1 links among them.
//  Switch: every GPU's links go to a switch (NVLink + NVSwitch), so any subset of GPUs gets the
//    full per-GPU bandwidth.
enum class Topology { FullyConnected, Switch };

struct GemmMeasurement {  // one row of the bench's GEMM efficiency table
  int64_t m = 0, n = 0, k = 0;
  std::string dtype = "bf16";
  double tflops = 0;    // achieved
  double fraction = 0;  // of the profile's peak
  double work_gflop() const { return 2.0 * double(m) * double(n) * double(k) * 1e-9; }
};

// One row of a kernel efficiency table: what the kernels of one class achieved at one amount of
// work. Attention classes: work in GFLOP (forward 4·T·keys·Hq·d, backward 2.5x that), rate in
// TFLOP/s, fraction of the bf16 peak. Memory-bound classes: work in GB (1e9 bytes) as the cost
// model counts the class's bytes (forward + backward), rate in GB/s of those bytes, fraction of the
// copy bandwidth.
struct KernelMeasurement {
  KernelClass cls = KernelClass::None;
  std::string shape;  // what was measured ("B4 S4096 Hq8 Hkv2 d128 causal", ...)
  double work = 0;
  double rate = 0;      // achieved TFLOP/s or GB/s (0: use fraction)
  double fraction = 0;  // of the peak or copy bandwidth (0: use rate)
  std::string source;   // "measured" or where a default comes from
};

struct CollectiveMeasurement {  // one row of the bench's collective table (nccl-tests busbw)
  std::string op;               // "all_reduce", "reduce_scatter", "all_gather", ...
  int ranks = 0;
  double bytes = 0;
  double busbw_gbs = 0;
  std::string backend;
};

struct HardwareProfile {
  std::string key;     // the built-in name this profile is ("mi300x", "h200", ...), or ""
  std::string device;  // display name
  std::string origin;  // "built-in" or the measured profile's path
  bool measured = false;

  int compute_units = 0;  // CUs (AMD) or SMs (NVIDIA)
  std::string cu_name = "SM";
  // The matrix unit's instruction tile (for operand alignment) and the output tile a tuned GEMM
  // library typically gives each CU/SM for large bf16 GEMMs (for wave quantization).
  int mma_m = 0, mma_n = 0, mma_k = 0;
  int tile_m = 0, tile_n = 0;

  double peak_bf16_tflops = 0;  // dense
  double peak_fp8_tflops = 0;   // dense; 0 when the device has no fp8 matrix unit
  // The vendor's bf16 figure even when peak_bf16_tflops is a measured one: MFU is quoted against
  // it.
  double datasheet_bf16_tflops = 0;
  double hbm_gib = 0;
  double hbm_peak_gbs = 0;    // datasheet
  double copy_gbs = 0;        // device copy, bytes read + written per second
  double read_gbs = 0;        // streaming read
  double h2d_gbs = 0;         // host to device, pinned
  double knee_gflop = 200;    // GEMM work needed to get close to peak (the profile's p90)
  double knee_p80_gflop = 0;  // when measured

  Topology topology = Topology::Switch;
  int gpus_per_node = 8;
  int links_per_gpu = 0;      // FullyConnected: direct peer links per GPU
  double link_gbs = 0;        // FullyConnected: per link, one direction
  double gpu_fabric_gbs = 0;  // Switch: per GPU, one direction
  double nic_gbs = 0;         // per GPU, one direction (scale-out)

  std::vector<GemmMeasurement> gemm;
  std::vector<CollectiveMeasurement> collectives;
  std::vector<KernelMeasurement> kernels;  // kernel efficiency rows, any order

  // Bytes per flop at which a kernel turns from memory- to compute-bound (peak / copy bandwidth).
  double ridge_flop_per_byte() const { return peak_bf16_tflops * 1e12 / (copy_gbs * 1e9); }
  // Achieved bf16 GEMM throughput (FLOP/s) for work `gflop`: the measured table interpolated in
  // log(work) when present (clamped at its ends), otherwise the datasheet peak.
  double gemm_flops_per_s(double gflop) const;
  // Bus bandwidth (bytes/s, nccl-tests definition) for a collective over `ranks` GPUs: measured
  // rows for the op when present (nearest rank count, log-interpolated in bytes), else the
  // topology: inside a node FullyConnected gives (n-1) links, Switch the full fabric bandwidth;
  // across nodes the NIC is the limit.
  double busbw_bytes_per_s(const std::string& op, int ranks, double bytes) const;
  // Bandwidth the topology alone gives a collective over n GPUs of one node (bytes/s, one way).
  double intra_node_busbw(int n) const;
  // Achieved rate of a kernel class for `work` (GFLOP or GB, see KernelMeasurement): FLOP/s for
  // attention, bytes/s for the memory-bound classes. The class's rows interpolated linearly in
  // log(work), clamped at their ends (a row's `rate` when set, else fraction × peak or copy);
  // with no rows for the class, the bf16 peak or the copy bandwidth (the pure roofline).
  double kernel_rate(KernelClass c, double work) const;
  // kernel_rate as a fraction of the peak or the copy bandwidth.
  double kernel_fraction(KernelClass c, double work) const;
  // The same profile without kernel efficiencies: non-GEMM kernels at the peak and the copy
  // bandwidth (GEMMs keep the measured table), as the cost model priced them before calibration.
  HardwareProfile roofline() const;

  nlohmann::json to_json() const;
};

std::vector<std::string> builtin_hardware_names();
// A built-in profile by name (case-insensitive; "h100" and "h100-sxm" are the same). Throws
// zaya::Error listing the known names.
HardwareProfile builtin_hardware(const std::string& name);
// The built-in key whose device this name describes ("NVIDIA H200" -> "h200"), or "" if none.
std::string match_builtin_device(const std::string& device_name);
// Parses a measured "zaya.hardware/1" profile; `where` names its source in errors.
// "kernel_efficiency" rows (optional): {"class", "work", "tflops" (attention) or "gbs" (memory
// classes), "fraction" in (0, 1], "shape", "source"}; a class the profile measures replaces the
// built-in's default rows of that class.
HardwareProfile hardware_from_json(const nlohmann::json& j, const std::string& where);
// The JSON form of kernel efficiency rows (as `zaya bench kernels` writes them).
nlohmann::json kernel_measurement_json(const KernelMeasurement& k);
// `--hardware` argument: a built-in name or a path to a measured profile JSON.
HardwareProfile load_hardware(const std::string& name_or_path);

}  // namespace zaya::sizing
