// Precompiled header: the torch headers dominate compile time of every translation unit.
#pragma once
#include <torch/torch.h>
