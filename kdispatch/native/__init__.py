"""The native launch cache: a C++ kernel that launches a torch op's already-checked calls
without entering Python (``launch_cache.cpp``; built by ``kdispatch build-ops``)."""
