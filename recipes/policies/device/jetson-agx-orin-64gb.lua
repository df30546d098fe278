-- NVIDIA Jetson AGX Orin 64GB (module of the developer kit), MAXN power mode: a device of the
-- LOIP paper's testbed (Sec. IV). Figures from [1] unless marked; A: assumptions, D: derived.
--   [1] NVIDIA, "Jetson AGX Orin Series Technical Brief", v1.2, July 2022
--       (https://www.nvidia.com/content/dam/en-zz/Solutions/gtcf21/jetson-orin/nvidia-jetson-agx-orin-technical-brief.pdf)
--   [2] NVIDIA, "Jetson AGX Orin Developer Kit User Guide" (developer.nvidia.com): an M.2 Key M
--       slot with PCIe Gen4 x4 for an NVMe SSD
return require("loip.sim.roofline").device {
  name = "jetson-agx-orin-64gb",
  memory_bytes = 64 * 1024 ^ 3,        -- [1] 64 GB 256-bit LPDDR5, shared by CPU and GPU
  memory_bps = 204.8e9,                -- [1] 204.8 GB/s
  -- D: 2048 CUDA cores = 16 SMs [1] x 1.3 GHz [1] x 2048 dense FP16 FLOPs per SM per clock (A)
  fp16_flops = 16 * 1.3e9 * 2048,      -- 42.6 TFLOP/s; half the 85 dense INT8 TOPS of its GPU [1]
  matvec_efficiency = 0.7,             -- A: decoding's matrix-vector products reach 70% of the bandwidth
  matmul_efficiency = 0.5,             -- A: prefill's matrix products reach 50% of the tensor peak
  disk_bps = 3.0e9,                    -- A: a PCIe Gen4 x4 NVMe SSD [2] read with O_DIRECT (the link carries 7.9 GB/s)
  load_ms = 0.1,                       -- A: a read's fixed cost (submission and completion through io_uring)
  transport_ms = 0.1,                  -- A: one message's own time through ZeroMQ over Ethernet
  block_overhead_ms = 0.02,            -- A: a block's kernel launches (about four, 5 us each)
  reserve_bytes = 2 * 1024 ^ 3,        -- A: Jetson Linux and the runtime keep 2 GiB
  sources = { "[1] NVIDIA Jetson AGX Orin Series Technical Brief v1.2 (July 2022)",
    "[2] NVIDIA Jetson AGX Orin Developer Kit User Guide" },
  assumptions = { "tensor cores at 2048 dense FP16 FLOPs per SM per clock (GA100's rate; half the 85 dense INT8 TOPS NVIDIA gives)",
    "matrix-vector products at 70% of the memory bandwidth, matrix products at 50% of the tensor peak",
    "an NVMe SSD read at 3.0 GB/s", "0.1 ms per read, 0.1 ms per message, 0.02 ms per block", "2 GiB kept by the OS and the runtime" },
}
