"""dasc compiler: decay-aware state compression plans for hybrid linear-attention models.

The compiler reads only the decay tensors of a checkpoint (paper Eq. 2), derives retention
horizons (Eq. 3), selects global units (H_s > w_max, §4.1), lays them out in a ragged pool
(App. B), computes TP maps (App. B.1, Fig. 9) and writes a versioned plan plus Triton kernels.
"""

__version__ = "0.1.0"
