// config_reference.h: docs/CONFIG.md, the reference of every key of a training job's YAML,
// rendered from the key table the parser reads (train_config.h: config_key_infos()), so the page
// and the parser cannot drift.
//
// What: config_reference_markdown() is the whole page: an introduction, one table per section
// (key, type, default, allowed values, meaning; top-level keys first, then the sections in the
// key table's order), and the environment
// variables (those that override a runtime.* key, and the ones that are not job keys).
// `qshard train --describe-config` prints it; tests/apps regenerates it and diffs docs/CONFIG.md
// (regenerate: build/cpu/qshard train --describe-config > docs/CONFIG.md).
// Thread safety: a pure function.
#pragma once

#include <string>

namespace qshard {

std::string config_reference_markdown();

}  // namespace qshard
