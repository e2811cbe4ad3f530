// selfattn/selfattn.hpp — the whole library in one include. Only includes.
#pragma once

#include <selfattn/attention.hpp>
#include <selfattn/dropout.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/heads.hpp>
#include <selfattn/kv_cache.hpp>
#include <selfattn/mask.hpp>
#include <selfattn/multihead.hpp>
#include <selfattn/options.hpp>
#include <selfattn/positional.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>
