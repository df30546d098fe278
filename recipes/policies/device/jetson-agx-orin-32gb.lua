-- NVIDIA Jetson AGX Orin 32GB, MAXN power mode: a device of the LOIP paper's testbed (Sec. IV).
-- Figures from [1] unless marked; A: assumptions, D: derived.
--   [1] NVIDIA, "Jetson AGX Orin Series Technical Brief", v1.2, July 2022
--       (https://www.nvidia.com/content/dam/en-zz/Solutions/gtcf21/jetson-orin/nvidia-jetson-agx-orin-technical-brief.pdf)
--   [2] NVIDIA, "Jetson AGX Orin Developer Kit User Guide": an M.2 Key M slot, PCIe Gen4 x4
return require("loip.sim.roofline").device {
  name = "jetson-agx-orin-32gb",
  memory_bytes = 32 * 1024 ^ 3,        -- [1] 32 GB 256-bit LPDDR5
  memory_bps = 204.8e9,                -- [1] 204.8 GB/s
  -- D: 1792 CUDA cores = 14 SMs [1] x 930 MHz [1] x 2048 dense FP16 FLOPs per SM per clock (A)
  fp16_flops = 14 * 0.93e9 * 2048,     -- 26.7 TFLOP/s; half the 54 dense INT8 TOPS of its GPU [1]
  matvec_efficiency = 0.7,             -- A: as the 64GB module
  matmul_efficiency = 0.5,             -- A: as the 64GB module
  disk_bps = 3.0e9,                    -- A: a PCIe Gen4 x4 NVMe SSD [2] read with O_DIRECT
  load_ms = 0.1,                       -- A
  transport_ms = 0.1,                  -- A
  block_overhead_ms = 0.02,            -- A
  reserve_bytes = 2 * 1024 ^ 3,        -- A: Jetson Linux and the runtime keep 2 GiB
  sources = { "[1] NVIDIA Jetson AGX Orin Series Technical Brief v1.2 (July 2022)",
    "[2] NVIDIA Jetson AGX Orin Developer Kit User Guide" },
  assumptions = { "tensor cores at 2048 dense FP16 FLOPs per SM per clock", "matrix-vector products at 70% of the memory bandwidth, matrix products at 50% of the tensor peak",
    "an NVMe SSD read at 3.0 GB/s", "0.1 ms per read, 0.1 ms per message, 0.02 ms per block", "2 GiB kept by the OS and the runtime" },
}
