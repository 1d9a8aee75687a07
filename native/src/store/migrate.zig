//! Manifest migration in place (update_manifests): a format-2 cache's id is its position
//! in the dataset's path list; migrating writes that id into its manifest as `cache_id`,
//! so the cache keeps it wherever it is loaded later. The rewrite goes through
//! `publish.publishFile`, so a crash leaves either the old or the new manifest.

const std = @import("std");
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const publish = @import("publish.zig");

/// Largest manifest read (the same bound as opening a cache).
const manifest_bytes_max = 64 << 20;

pub const Outcome = enum(u8) { unchanged, updated, durability_unknown };

/// Migrates the manifest file at `path` (a resolved file path, not a symlink: the caller
/// reports and replaces the target) to format 3 with `cache_id`.
/// Errors: error.Io ("I/O error: ..."), error.Json, error.InvalidCache (manifest.migrate).
pub fn migrateManifest(gpa: std.mem.Allocator, path: []const u8, cache_id: u64) status.Error!Outcome {
    const text = std.fs.cwd().readFileAlloc(gpa, path, manifest_bytes_max) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        error.FileTooBig => return status.fail(error.InvalidCache, "manifest is too large: {s}", .{path}),
        else => return status.fail(error.Io, "I/O error: {s}", .{status.describeOsError(err)}),
    };
    defer gpa.free(text);
    const migrated = switch (try manifest.migrate(gpa, text, cache_id, path)) {
        .unchanged => return .unchanged,
        .text => |t| t,
    };
    defer gpa.free(migrated);
    const dir = std.fs.path.dirname(path) orelse ".";
    return switch (try publish.publishFile(gpa, dir, std.fs.path.basename(path), migrated, true)) {
        .durable => .updated,
        .unknown => .durability_unknown,
    };
}

test "migrate a manifest file in place" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "manifest.json", .data = "{\"format_version\": 2, \"source_name\": \"a\"}" });
    const dir_path = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(dir_path);
    const path = try std.fs.path.join(gpa, &.{ dir_path, "manifest.json" });
    defer gpa.free(path);
    try std.testing.expectEqual(Outcome.updated, try migrateManifest(gpa, path, 5));
    const after = try tmp.dir.readFileAlloc(gpa, "manifest.json", 1 << 10);
    defer gpa.free(after);
    try std.testing.expectEqualStrings("{\n  \"format_version\": 3,\n  \"cache_id\": 5,\n  \"source_name\": \"a\"\n}", after);
    try std.testing.expectEqual(Outcome.unchanged, try migrateManifest(gpa, path, 5));
    // No temporary file is left behind.
    var it = tmp.dir.iterate();
    var names: usize = 0;
    while (try it.next()) |_| names += 1;
    try std.testing.expectEqual(@as(usize, 1), names);
    const missing = try std.fs.path.join(gpa, &.{ dir_path, "gone.json" });
    defer gpa.free(missing);
    try std.testing.expectError(error.Io, migrateManifest(gpa, missing, 5));
    try std.testing.expectEqualStrings("I/O error: No such file or directory (os error 2)", status.lastMessage());
}
