-- Galaxy (Ye et al., "Galaxy: A Resource-Efficient Collaborative Edge AI System for In-situ
-- Transformer Inference", INFOCOM 2024), as the LOIP paper compares it: hybrid tensor and sequence
-- parallelism, each device's slice of every layer sized by its compute, ring all-reduces (a
-- reduce-scatter and an all-gather) after each attention and each MLP. No offloading: a device
-- whose slice does not fit is out of memory. (Galaxy overlaps part of its communication with
-- compute on long prompts; decoding's one-token steps leave nothing to overlap, so none is here.)
return require("loip.sim.tp").model { name = "galaxy", split = "speed", allreduce = "ring", offload = false }
