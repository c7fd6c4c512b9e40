// A block at namespace scope after the umbrella header.
#include <dtrain/dtrain.hpp>

// @block@
