"""Private plumbing any layer may use: the native extension, the one Vulkan-call wrapper, handles,
reprs, lifetimes, timeline points, formats, shipped shaders and the shared argument checks."""
