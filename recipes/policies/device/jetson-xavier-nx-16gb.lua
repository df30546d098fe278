-- NVIDIA Jetson Xavier NX 16GB, 20 W mode: a device of the LOIP paper's testbed (Sec. IV).
-- Figures from [1] unless marked; A: assumptions, D: derived.
--   [1] NVIDIA, "Jetson Xavier NX Series Data Sheet" (DS-09693-001)
--   [2] NVIDIA, "Jetson Xavier NX Developer Kit User Guide": an M.2 Key M slot, PCIe Gen3 x4
return require("loip.sim.roofline").device {
  name = "jetson-xavier-nx-16gb",
  memory_bytes = 16 * 1024 ^ 3,        -- [1] 16 GB 128-bit LPDDR4x
  memory_bps = 59.7e9,                 -- [1] 59.7 GB/s
  -- D: 384 CUDA cores = 6 Volta SMs [1] x 1.1 GHz [1] x 1024 dense FP16 FLOPs per SM per clock (A)
  fp16_flops = 6 * 1.1e9 * 1024,       -- 6.8 TFLOP/s on its 48 tensor cores
  matvec_efficiency = 0.7,             -- A
  matmul_efficiency = 0.5,             -- A
  disk_bps = 1.5e9,                    -- A: an NVMe SSD on PCIe Gen3 x4 [2] read with O_DIRECT (the link carries 3.9 GB/s)
  load_ms = 0.1,                       -- A
  transport_ms = 0.1,                  -- A
  block_overhead_ms = 0.03,            -- A: slower kernel launches than Orin's
  reserve_bytes = 2 * 1024 ^ 3,        -- A: Jetson Linux and the runtime keep 2 GiB
  sources = { "[1] NVIDIA Jetson Xavier NX Series Data Sheet (DS-09693-001)", "[2] NVIDIA Jetson Xavier NX Developer Kit User Guide" },
  assumptions = { "Volta tensor cores at 1024 dense FP16 FLOPs per SM per clock (V100's rate)",
    "matrix-vector products at 70% of the memory bandwidth, matrix products at 50% of the tensor peak",
    "an NVMe SSD read at 1.5 GB/s", "0.1 ms per read, 0.1 ms per message, 0.03 ms per block", "2 GiB kept by the OS and the runtime" },
}
