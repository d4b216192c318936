// Policy metadata: what pi0-serve tells every client on connect beyond its own keys — openpi's
// TrainConfig.policy_metadata. openpi's ALOHA configs declare {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]}, which its
// ALOHA example passes to the robot environment as the joint pose to reset the arms to (without it a real arm
// resets elsewhere). The training config declares it (serve.policy_metadata, any YAML map), the bundle carries it
// in its config.yaml, and it is resolved here against the defaults of the robot the data comes from, so bundles
// exported before the key existed get the defaults too. pi0-serve's --metadata key=json adds to it
// (serve/policy.h). docs/serving.md, "Metadata".
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/config/config.h"

namespace pi0::config {

/// Keys pi0-serve's metadata sets itself (robot, action_horizon, dtype, ...): refused as policy metadata, since a
/// client reading them must get the server's truth.
const std::vector<std::string>& reserved_metadata_keys();

/// openpi's defaults for the robot of `config`'s data: ALOHA (data.dataset.format aloha, or adapt_to_pi on) →
/// {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]} (openpi's pi0_aloha, pi05_aloha, *_towel, *_tupperware); else {}.
nlohmann::json default_policy_metadata(const Config& config);

/// The defaults overlaid with serve.policy_metadata; a key set to null removes a default. Throws pi0::UserError
/// naming serve.policy_metadata.<key> for a reserved key or a value JSON cannot hold (a non-finite number, a map
/// key that is not a name).
nlohmann::json policy_metadata(const Config& config);

/// Sets `key` of `metadata` to `value` (null: removes it); UserError naming `source` for a reserved or empty key.
void set_policy_metadata(nlohmann::json& metadata, const std::string& key, const nlohmann::json& value,
                         const std::string& source);

}  // namespace pi0::config
