#pragma once
/// @file
/// dtrain: everything that needs only the standard library. Backends that need Boost.Asio,
/// Thrust, CUDA or NCCL have their own headers (dtrain/reduce/thrust.hpp, ...), never pulled in
/// here.

#include "dtrain/concepts/collective.hpp"
#include "dtrain/concepts/completion.hpp"
#include "dtrain/concepts/consistency.hpp"
#include "dtrain/concepts/element.hpp"
#include "dtrain/concepts/reduction.hpp"
#include "dtrain/concepts/transport.hpp"
#include "dtrain/concepts/updater.hpp"
#include "dtrain/collective/communicator.hpp"
#include "dtrain/collective/selection.hpp"
#include "dtrain/consistency/policies.hpp"
#include "dtrain/core/deadline.hpp"
#include "dtrain/core/element.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/memory_space.hpp"
#include "dtrain/core/reduce_op.hpp"
#include "dtrain/core/signature.hpp"
#include "dtrain/reduce/host.hpp"
#include "dtrain/transport/inproc.hpp"
#include "dtrain/updater/adagrad.hpp"
#include "dtrain/updater/adam.hpp"
#include "dtrain/updater/momentum.hpp"
#include "dtrain/updater/rmsprop.hpp"
#include "dtrain/updater/sgd.hpp"
#include "dtrain/updater/staleness_aware.hpp"
