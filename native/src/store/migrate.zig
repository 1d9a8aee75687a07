//! Manifest migration in place (update_manifests): a format-2 cache's id is its position
//! in the dataset's path list; migrating writes that id into its manifest as `cache_id`,
//! so the cache keeps it wherever it is loaded later. Rewrites go through
//! `publish.publishFile`, so a crash leaves either the old or the new manifest.
//!
//! `migrateAll` migrates a dataset's caches all or nothing, as dataset-rt 0.4.8 does:
//! every target is checked first, in cache order, against the manifest the dataset
//! loaded (missing or unreadable, invalid, downgraded, cache_id changed, content
//! changed, the same file or id twice), and the first failure is returned before any
//! file is written. Only then is each format-2 manifest rewritten, each atomically; a
//! manifest that changed between the check and its rewrite stops the migration there.

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
    const migration = manifest.migrate(gpa, text, cache_id, path) catch |err| {
        dropPathSuffix(path);
        return err;
    };
    const migrated = switch (migration) {
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

/// `manifest.parse` ends its messages with " in <path>"; update_manifests reports the
/// manifest as the error's path, so the message keeps the reference's own words.
fn dropPathSuffix(path: []const u8) void {
    const message = status.lastMessage();
    if (message.len < path.len + 4 or !std.mem.endsWith(u8, message, path)) return;
    const head = message[0 .. message.len - path.len];
    if (!std.mem.endsWith(u8, head, " in ")) return;
    var buf: [status.message_bytes_max]u8 = undefined;
    const kept = head[0 .. head.len - 4];
    @memcpy(buf[0..kept.len], kept);
    status.setMessage(buf[0..kept.len]);
}

/// One cache of a dataset to migrate.
pub const Target = struct {
    /// `<cache path>/manifest.json` as the dataset names it (resolved here).
    path: []const u8,
    /// The manifest parsed when the dataset was opened.
    loaded: *const manifest.Manifest,
    /// The cache's id in the dataset: its stored id, or its position for format 2.
    cache_id: u64,
};

/// What `migrateAll` did to one target.
pub const Entry = struct {
    /// The resolved manifest file (symlinks followed), allocated in the caller's arena.
    path: []const u8 = "",
    cache_id: u64 = 0,
    outcome: Outcome = .unchanged,
};

/// How far `migrateAll` got: `done` targets finished (0 when a check failed, so nothing
/// was written); `failed` is the target whose failure the status message describes.
pub const Progress = struct {
    done: usize = 0,
    failed: ?usize = null,
};

/// A checked target: the bytes that were checked and, for format 2, the new text.
const Planned = struct {
    bytes: []u8,
    text: ?[]u8,
};

/// Migrates every target, all or nothing (see the file comment). `entries` (one per
/// target) receive the resolved paths (allocated in `arena`, which outlives the call),
/// ids and outcomes; `progress` says how far it got when an error is returned.
/// Check order per target, as in the reference: resolve and read the file (error.Io:
/// "I/O error: No such file or directory (os error 2)"), parse it (error.Json /
/// error.InvalidCache, the load's messages without the path), then against the loaded
/// manifest: "manifest was downgraded since dataset construction" (format 3 at load, 2
/// now), "manifest cache_id changed since dataset construction", "manifest changed since
/// dataset construction", then "duplicate migration target or cache_id" (a resolved file
/// or an id met before). Writing: "manifest changed during migration" when a file is not
/// the one checked any more, and publishFile's errors.
pub fn migrateAll(gpa: std.mem.Allocator, arena: std.mem.Allocator, targets: []const Target, entries: []Entry, progress: *Progress) status.Error!void {
    std.debug.assert(entries.len == targets.len);
    progress.* = .{};
    const plans = try gpa.alloc(Planned, targets.len);
    var planned: usize = 0;
    defer {
        for (plans[0..planned]) |plan| {
            gpa.free(plan.bytes);
            if (plan.text) |t| gpa.free(t);
        }
        gpa.free(plans);
    }
    var seen_paths: std.StringHashMapUnmanaged(void) = .empty;
    defer seen_paths.deinit(gpa);
    var seen_ids: std.AutoHashMapUnmanaged(u64, void) = .empty;
    defer seen_ids.deinit(gpa);

    for (targets, entries, 0..) |target, *entry, i| {
        progress.failed = i;
        const resolved = std.fs.cwd().realpathAlloc(arena, target.path) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            else => return status.fail(error.Io, "I/O error: {s}", .{status.describeOsError(err)}),
        };
        const bytes = try readManifest(gpa, resolved);
        plans[i] = .{ .bytes = bytes, .text = null };
        planned += 1;
        var current = manifest.parse(gpa, bytes, target.path) catch |err| {
            dropPathSuffix(target.path);
            return err;
        };
        defer current.deinit();
        if (target.loaded.format_version == 3 and current.format_version == 2) {
            return status.fail(error.InvalidCache, "manifest was downgraded since dataset construction", .{});
        }
        if (current.cache_id) |id| {
            if (id != target.cache_id) return status.fail(error.InvalidCache, "manifest cache_id changed since dataset construction", .{});
        }
        if (!manifest.sameContent(target.loaded, &current)) {
            return status.fail(error.InvalidCache, "manifest changed since dataset construction", .{});
        }
        const path_entry = try seen_paths.getOrPut(gpa, resolved);
        const id_entry = try seen_ids.getOrPut(gpa, target.cache_id);
        if (path_entry.found_existing or id_entry.found_existing) {
            return status.fail(error.InvalidCache, "duplicate migration target or cache_id", .{});
        }
        if (current.format_version == 2) {
            var out: std.ArrayList(u8) = .empty;
            errdefer out.deinit(gpa);
            try manifest.writeMigrated(gpa, &out, &current, target.cache_id);
            plans[i].text = try out.toOwnedSlice(gpa);
        }
        entry.* = .{ .path = resolved, .cache_id = target.cache_id, .outcome = .unchanged };
    }

    for (plans, entries, 0..) |plan, *entry, i| {
        progress.failed = i;
        if (plan.text) |text| {
            const now = try readManifest(gpa, entry.path);
            defer gpa.free(now);
            if (!std.mem.eql(u8, now, plan.bytes)) return status.fail(error.InvalidCache, "manifest changed during migration", .{});
            const dir = std.fs.path.dirname(entry.path) orelse "/";
            entry.outcome = switch (try publish.publishFile(gpa, dir, std.fs.path.basename(entry.path), text, true)) {
                .durable => .updated,
                .unknown => .durability_unknown,
            };
        }
        progress.done = i + 1;
    }
    progress.failed = null;
}

/// The bytes of the manifest file at `path` (error.Io with the reference's text).
fn readManifest(gpa: std.mem.Allocator, path: []const u8) status.Error![]u8 {
    return std.fs.cwd().readFileAlloc(gpa, path, manifest_bytes_max) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        error.FileTooBig => return status.fail(error.InvalidCache, "manifest is too large: {s}", .{path}),
        else => return status.fail(error.Io, "I/O error: {s}", .{status.describeOsError(err)}),
    };
}

test "migrate a manifest file in place" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "manifest.json", .data = "{\"format_version\": 2, \"source_name\": \"a\", \"sample_count\": 0, \"metadata_schema\": [], \"metadata_sha256\": \"m\", \"index_sha256\": \"i\", \"shards\": []}" });
    const dir_path = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(dir_path);
    const path = try std.fs.path.join(gpa, &.{ dir_path, "manifest.json" });
    defer gpa.free(path);
    try std.testing.expectEqual(Outcome.updated, try migrateManifest(gpa, path, 5));
    const after = try tmp.dir.readFileAlloc(gpa, "manifest.json", 1 << 10);
    defer gpa.free(after);
    try std.testing.expectEqualStrings("{\n  \"format_version\": 3,\n  \"cache_id\": 5,\n  \"source_name\": \"a\",\n  \"sample_count\": 0,\n  \"metadata_schema\": [],\n  \"metadata_sha256\": \"m\",\n  \"index_sha256\": \"i\",\n  \"shards\": []\n}", after);
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

test "migrateAll checks every target before writing any" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const v2 = "{\"format_version\": 2, \"source_name\": \"{s}\", \"sample_count\": 0, \"metadata_schema\": [], \"metadata_sha256\": \"m\", \"index_sha256\": \"i\", \"shards\": [], \"zz\": 1}";
    const text_a = try std.mem.replaceOwned(u8, gpa, v2, "{s}", "a");
    defer gpa.free(text_a);
    const text_b = try std.mem.replaceOwned(u8, gpa, v2, "{s}", "b");
    defer gpa.free(text_b);
    try tmp.dir.makePath("a");
    try tmp.dir.makePath("b");
    try tmp.dir.writeFile(.{ .sub_path = "a/manifest.json", .data = text_a });
    try tmp.dir.writeFile(.{ .sub_path = "b/manifest.json", .data = text_b });
    const root = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(root);
    const path_a = try std.fs.path.join(gpa, &.{ root, "a", "manifest.json" });
    defer gpa.free(path_a);
    const path_b = try std.fs.path.join(gpa, &.{ root, "b", "manifest.json" });
    defer gpa.free(path_b);
    var loaded_a = try manifest.parse(gpa, text_a, path_a);
    defer loaded_a.deinit();
    var loaded_b = try manifest.parse(gpa, text_b, path_b);
    defer loaded_b.deinit();

    var arena_state = std.heap.ArenaAllocator.init(gpa);
    defer arena_state.deinit();
    const arena = arena_state.allocator();
    var entries: [2]Entry = undefined;
    var progress: Progress = .{};
    const both = [_]Target{ .{ .path = path_a, .loaded = &loaded_a, .cache_id = 0 }, .{ .path = path_b, .loaded = &loaded_b, .cache_id = 1 } };

    // A later target that changed, or is missing, fails before the first is written.
    const changed = try std.mem.replaceOwned(u8, gpa, text_b, "\"zz\": 1", "\"zz\": 1.0");
    defer gpa.free(changed);
    try tmp.dir.writeFile(.{ .sub_path = "b/manifest.json", .data = changed });
    try std.testing.expectError(error.InvalidCache, migrateAll(gpa, arena, &both, &entries, &progress));
    try std.testing.expectEqualStrings("manifest changed since dataset construction", status.lastMessage());
    try std.testing.expectEqual(Progress{ .done = 0, .failed = 1 }, progress);
    try tmp.dir.deleteFile("b/manifest.json");
    try std.testing.expectError(error.Io, migrateAll(gpa, arena, &both, &entries, &progress));
    try std.testing.expectEqualStrings("I/O error: No such file or directory (os error 2)", status.lastMessage());
    var buf: [512]u8 = undefined;
    try std.testing.expectEqualStrings(text_a, try tmp.dir.readFile("a/manifest.json", &buf));

    // The same file twice.
    const twice = [_]Target{ both[0], .{ .path = path_a, .loaded = &loaded_a, .cache_id = 1 } };
    try std.testing.expectError(error.InvalidCache, migrateAll(gpa, arena, &twice, &entries, &progress));
    try std.testing.expectEqualStrings("duplicate migration target or cache_id", status.lastMessage());
    try std.testing.expectEqual(@as(?usize, 1), progress.failed);

    // Every target passes: both rewritten, then both unchanged.
    try tmp.dir.writeFile(.{ .sub_path = "b/manifest.json", .data = text_b });
    try migrateAll(gpa, arena, &both, &entries, &progress);
    try std.testing.expectEqual(Progress{ .done = 2, .failed = null }, progress);
    try std.testing.expectEqual(Outcome.updated, entries[1].outcome);
    try std.testing.expectEqualStrings(path_b, entries[1].path);
    const migrated_b = try tmp.dir.readFile("b/manifest.json", &buf);
    try std.testing.expect(std.mem.startsWith(u8, migrated_b, "{\n  \"format_version\": 3,\n  \"cache_id\": 1,\n  \"source_name\": \"b\""));
    try std.testing.expect(std.mem.endsWith(u8, migrated_b, "\"shards\": [],\n  \"zz\": 1\n}"));
    try migrateAll(gpa, arena, &both, &entries, &progress);
    try std.testing.expectEqual(Outcome.unchanged, entries[0].outcome);

    // Loaded as format 3, format 2 again on disk: downgraded.
    var loaded_v3 = try manifest.parse(gpa, migrated_b, path_b);
    defer loaded_v3.deinit();
    try tmp.dir.writeFile(.{ .sub_path = "b/manifest.json", .data = text_b });
    const v3_target = [_]Target{.{ .path = path_b, .loaded = &loaded_v3, .cache_id = 1 }};
    try std.testing.expectError(error.InvalidCache, migrateAll(gpa, arena, &v3_target, entries[0..1], &progress));
    try std.testing.expectEqualStrings("manifest was downgraded since dataset construction", status.lastMessage());
}
