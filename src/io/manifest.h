// Checkpoint manifests: manifest.json, written last into a checkpoint directory, lists every
// other file (recursively, paths relative with '/', so per-rank files in subfolders are just more
// entries) with its size and XXH64, plus a free-form JSON object for the caller (step, config
// hash, ...). A checkpoint whose manifest verifies is complete and unmodified.
//
// Deliberately not here: deciding what goes into a checkpoint or which checkpoint is the latest
// (ckpt/ does that), and signing: XXH64 detects corruption, not tampering.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zaya {

constexpr const char* kManifestName = "manifest.json";
constexpr int kManifestVersion = 1;

struct ManifestEntry {
  std::string path;  // relative to the checkpoint directory, '/'-separated
  uint64_t size = 0;
  uint64_t xxh64 = 0;
};

struct Manifest {
  int version = kManifestVersion;
  std::vector<ManifestEntry> files;  // sorted by path
  nlohmann::json extra = nlohmann::json::object();
};

// Hashes every regular file under `dir` except `dir`/manifest.json and writes the manifest
// atomically. `extra` must be a JSON object. Symbolic links to regular files are hashed as the
// file they point to; any other kind of entry (socket, fifo, link to a directory) is an Error.
// Returns what was written.
Manifest write_manifest(const std::string& dir,
                        const nlohmann::json& extra = nlohmann::json::object());

// Writes the manifest of files whose sizes and checksums were computed as they were written
// (each rank of a sharded save hashes its own files): every entry must exist under `dir` with its
// size (checked with stat; the bytes are not read again) and no path may repeat. Entries are
// sorted by path. An Error names the first entry that does not match.
Manifest write_manifest_entries(const std::string& dir, std::vector<ManifestEntry> files,
                                const nlohmann::json& extra = nlohmann::json::object());

// Parses `dir`/manifest.json; an Error names the file and the malformed field.
Manifest read_manifest(const std::string& dir);

struct ManifestCheck {
  bool ok = false;
  // Empty when ok; else the first problem, e.g. "model.safetensors: checksum 0x... expected
  // 0x...", "shard/x.bin: missing", "a.bin: size 123 expected 456",
  // "manifest.json missing or malformed: ...".
  std::string reason;
  std::vector<std::string> problems;  // every problem found, reason first
  std::vector<std::string> unlisted;  // files present but not in the manifest (not an error)
  Manifest manifest;                  // as read (empty when the manifest itself is bad)
};

// Checks every listed file's size and (when check_hashes) checksum. Never throws for a bad
// checkpoint: a missing or malformed manifest is a failed check with a reason.
ManifestCheck verify_manifest(const std::string& dir, bool check_hashes = true);

}  // namespace zaya
