"""candidate_scheduler: a serving scheduler for diffusion action generation.

One logical request asks for N stochastic candidate action trajectories from one observation; the
candidates run as one group (one physical batch, or microbatches when they do not fit), and are
reduced to one served action by a model-declared reducer. See docs in the design notes.
"""

__version__ = "0.1.0"
