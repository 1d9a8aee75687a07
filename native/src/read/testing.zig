//! Helpers for the reader's unit tests; only test blocks reference this file, so none of
//! it is compiled into the library.
//!
//! - The reference caches written by dataset-rt 0.4.8 (`tests/fixtures/dataset-rt-0.4.8`,
//!   found through the test module's `fixtures_dir` build option, an absolute path) and
//!   their `<name>.expected.json` (payload length and SHA-256, metadata per sample).
//! - `Env`: a runtime and a dataset opened on fixture caches (or copies of them) for one
//!   I/O backend; io_uring skips with `error.SkipZigTest` where the kernel refuses it.
//! - `Env.expectSample` / `Env.expectEpoch`: a batch or a whole iterator window checked
//!   against expected.json, where the expected order is computed without the dataset's
//!   own bookkeeping (path order from the expected sample counts, cache ids from names).
//! - `copyFixture` (a private copy to corrupt, with `readIndex` / `writeIndex` to edit its
//!   index) and `writeSyntheticCache` (index rows and sparse shards of any shape, for
//!   planning tests; its records are not readable); `readRecord` (a record's bytes read
//!   straight from its shard) and `openFdCount` (descriptor leaks).
//!
//! Everything is allocated with the caller's allocator (`std.testing.allocator` in the
//! tests), so a leak in the reader or in these helpers fails the test.

const std = @import("std");
const build_options = @import("build_options");
const status = @import("../base/status.zig");
const Runtime = @import("../base/runtime.zig").Runtime;
const Sha256 = @import("../codec/sha256.zig").Sha256;
const schema = @import("../format/schema.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const io = @import("../io/backend.zig");
const uring = @import("../io/uring.zig");
const dataset_mod = @import("dataset.zig");
const iterator = @import("iterator.zig");
const batch_mod = @import("batch.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Iter = iterator.Iter;

const testing = std.testing;

/// Absolute path of the reference caches.
pub const fixtures_dir: []const u8 = build_options.fixtures_dir;

/// The fixture caches with the schema flag/label/name/score (text_records_v1 has another).
pub const same_schema = [_][]const u8{ "plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name" };

/// The schema of the `same_schema` caches.
pub const fixture_fields = [_]schema.Field{
    .{ .name = "flag", .kind = .bool },
    .{ .name = "label", .kind = .int },
    .{ .name = "name", .kind = .string },
    .{ .name = "score", .kind = .float },
};

/// `<fixtures_dir>/<name>`. Caller frees.
pub fn fixturePath(gpa: std.mem.Allocator, name: []const u8) ![]u8 {
    return std.fs.path.join(gpa, &.{ fixtures_dir, name });
}

/// One sample of an expected.json.
pub const ExpectedSample = struct {
    sample_id: u64,
    len: u64,
    /// Lowercase hex SHA-256 of the payload.
    sha256: []const u8,
    /// The metadata object (field name → value).
    metadata: std.json.Value,
};

const ExpectedFile = struct { samples: []ExpectedSample };

/// A parsed `<name>.expected.json`.
pub const Expected = struct {
    parsed: std.json.Parsed(ExpectedFile),

    pub fn load(gpa: std.mem.Allocator, name: []const u8) !Expected {
        const file_name = try std.fmt.allocPrint(gpa, "{s}.expected.json", .{name});
        defer gpa.free(file_name);
        const path = try fixturePath(gpa, file_name);
        defer gpa.free(path);
        const text = try std.fs.cwd().readFileAlloc(gpa, path, 1 << 24);
        defer gpa.free(text);
        // The parsed values live in an arena of libc's allocator: they are the tests'
        // data, not the reader's, and the testing allocator would capture a stack trace
        // for each of their thousands of allocations (a tenth of the tests' run time).
        const parsed = try std.json.parseFromSlice(ExpectedFile, std.heap.c_allocator, text, .{
            .ignore_unknown_fields = true,
            .allocate = .alloc_always,
        });
        for (parsed.value.samples, 0..) |s, i| std.debug.assert(s.sample_id == i);
        return .{ .parsed = parsed };
    }

    pub fn deinit(e: *Expected) void {
        e.parsed.deinit();
    }

    pub fn samples(e: *const Expected) []const ExpectedSample {
        return e.parsed.value.samples;
    }
};

/// How a test's dataset is opened.
pub const Config = struct {
    backend: io.Kind = .threads,
    prefetch_size: u64 = 16,
    shuffle: bool = false,
    permutation: bool = false,
    seed: u64 = 20240601,
    validate_cache: bool = false,
    workers: u64 = 2,
};

/// A runtime and a dataset over fixture caches, with the caches' expected samples.
pub const Env = struct {
    gpa: std.mem.Allocator,
    config: Config,
    rt: *Runtime,
    ds: *Dataset,
    /// expected.json of each cache, in path order.
    expected: []Expected,
    /// The reference cache id of each cache (from its source name), in path order.
    cache_ids: []u64,

    /// Opens the fixtures `names` in this order.
    pub fn openFixtures(gpa: std.mem.Allocator, names: []const []const u8, config: Config) !Env {
        const paths = try gpa.alloc([]const u8, names.len);
        defer gpa.free(paths);
        var made: usize = 0;
        defer for (paths[0..made]) |p| gpa.free(p);
        for (names, paths) |name, *p| {
            p.* = try fixturePath(gpa, name);
            made += 1;
        }
        return open(gpa, paths, names, config);
    }

    /// Opens the caches at `paths`, where `paths[i]` holds (a copy of) fixture `names[i]`;
    /// `names` null for caches without an expected.json (then `expected` and `cache_ids`
    /// are empty and the sample checks cannot be used). error.SkipZigTest when io_uring is
    /// asked for and this process may not use it.
    pub fn open(gpa: std.mem.Allocator, paths: []const []const u8, names: ?[]const []const u8, config: Config) !Env {
        if (names) |n| std.debug.assert(paths.len == n.len);
        if (config.backend == .io_uring and !uring.available()) return error.SkipZigTest;
        const known = names orelse &.{};
        const expected = try gpa.alloc(Expected, known.len);
        var loaded: usize = 0;
        errdefer {
            for (expected[0..loaded]) |*e| e.deinit();
            gpa.free(expected);
        }
        for (known, expected) |name, *e| {
            e.* = try Expected.load(gpa, name);
            loaded += 1;
        }
        const cache_ids = try gpa.alloc(u64, known.len);
        errdefer gpa.free(cache_ids);
        for (known, cache_ids) |name, *id| id.* = manifest.cacheIdForName(name);
        const rt = try Runtime.open(gpa, config.workers);
        errdefer rt.release();
        const ds = Dataset.open(gpa, rt, paths, .{
            .seed = config.seed,
            .prefetch_size = config.prefetch_size,
            .shuffle = config.shuffle,
            .validate_cache = config.validate_cache,
            .io_backend = switch (config.backend) {
                .io_uring => .io_uring,
                .threads => .threads,
            },
            .permutation = config.permutation,
        }) catch |err| return report(err, "Dataset.open");
        return .{ .gpa = gpa, .config = config, .rt = rt, .ds = ds, .expected = expected, .cache_ids = cache_ids };
    }

    pub fn close(env: *Env) void {
        env.ds.release();
        env.rt.release();
        for (env.expected) |*e| e.deinit();
        env.gpa.free(env.expected);
        env.gpa.free(env.cache_ids);
        env.* = undefined;
    }

    /// An iterator over the dataset's next window. error.SkipZigTest when io_uring was
    /// asked for but the ring could not be created (the backend fell back to threads).
    pub fn openIter(env: *const Env) !*Iter {
        const it = Iter.open(env.ds) catch |err| return report(err, "Iter.open");
        if (it.io.kind() != env.config.backend) {
            it.close();
            return error.SkipZigTest;
        }
        return it;
    }

    /// Samples in all caches, from expected.json.
    pub fn total(env: *const Env) u64 {
        var n: u64 = 0;
        for (env.expected) |*e| n += e.samples().len;
        return n;
    }

    /// The sample at path-order position `flat` (< total), counted from expected.json.
    pub fn pathOrder(env: *const Env, flat: u64) Loc {
        var rest = flat;
        for (env.expected, 0..) |*e, i| {
            if (rest < e.samples().len) return .{ .cache = @intCast(i), .sample_id = rest };
            rest -= e.samples().len;
        }
        unreachable;
    }

    /// The sample window index `k` of `it` must deliver. Ordered reading over the initial
    /// table is path order (computed here); otherwise the dataset's sampler decides
    /// (sampler.zig has its own golden tests).
    pub fn expectedLoc(env: *const Env, it: *const Iter, k: u64) Loc {
        const p = it.schedule.position(k);
        if (!env.config.shuffle and it.table.cache.len == 0) return env.pathOrder(p % env.total());
        return env.ds.locate(it.table, p);
    }

    /// Checks sample `i` of `view` against expected sample `loc`: identity, payload
    /// length and SHA-256, every metadata column, and for a contiguous view the arena
    /// offsets.
    pub fn expectSample(env: *const Env, view: batch_mod.View, i: usize, loc: Loc) !void {
        errdefer std.debug.print("sample {d} of a batch of {d}: expected cache {d} sample {d}\n", .{ i, view.count, loc.cache, loc.sample_id });
        std.debug.assert(i < view.count);
        const want = env.expected[loc.cache].samples()[@intCast(loc.sample_id)];
        try testing.expectEqual(env.cache_ids[loc.cache], view.cache_ids.?[i]);
        try testing.expectEqual(loc.sample_id, view.sample_ids.?[i]);
        const len = view.payload_lens.?[i];
        const payload = view.payloads.?[i][0..@intCast(len)];
        try testing.expectEqual(want.len, len);
        var digest: [32]u8 = undefined;
        Sha256.hash(payload, &digest);
        try testing.expectEqualStrings(want.sha256, &std.fmt.bytesToHex(digest, .lower));
        if (view.payload_base) |base| {
            try testing.expectEqual(base + @as(usize, @intCast(view.payload_offsets.?[i])), view.payloads.?[i]);
        } else try testing.expect(view.payload_offsets == null);
        try expectColumns(env.ds.fields, view, i, want.metadata);
    }

    /// Reads `it` to its end in batches of at most `max_count` and checks every sample
    /// (`expectSample` at `expectedLoc`) and every batch's size: a contiguous batch is
    /// as full as asked (bounded ones: at least one sample), one that stays in the slots
    /// holds at most half the prefetch window. Afterwards the iterator keeps returning empty batches. Returns the count.
    pub fn expectEpoch(env: *const Env, it: *Iter, max_count: u64, contiguous: bool) !u64 {
        const half_window = @max(1, @min(env.config.prefetch_size, 1 << 16) / 2);
        var k: u64 = 0;
        while (true) {
            const view = it.nextBatch(max_count, contiguous) catch |err| return report(err, "nextBatch");
            if (view.count == 0) break;
            const remaining = it.schedule.count - k;
            if (contiguous and it.batch.bounded) {
                // DRT_BATCH_BOUNDED: stops at about the byte budget.
                try testing.expect(view.count >= 1 and view.count <= @min(max_count, remaining));
            } else if (contiguous) {
                try testing.expectEqual(@min(max_count, remaining), view.count);
            } else {
                try testing.expect(view.count <= @min(max_count, half_window));
            }
            try testing.expectEqual(env.ds.fields.len, view.columns.len);
            for (0..@intCast(view.count)) |i| try env.expectSample(view, i, env.expectedLoc(it, k + i));
            k += view.count;
        }
        try testing.expectEqual(it.schedule.count, k);
        try testing.expectEqual(@as(u64, 0), (try it.nextBatch(max_count, contiguous)).count);
        return k;
    }

    /// The (cache position, sample id) of every sample of the iterator's remaining
    /// window, read in batches of `max_count`. Caller frees.
    pub fn collect(env: *const Env, it: *Iter, max_count: u64) ![]Loc {
        var out: std.ArrayList(Loc) = .empty;
        errdefer out.deinit(env.gpa);
        while (true) {
            const view = it.nextBatch(max_count, false) catch |err| return report(err, "nextBatch");
            if (view.count == 0) break;
            for (0..@intCast(view.count)) |i| {
                const cache = std.mem.indexOfScalar(u64, env.cache_ids, view.cache_ids.?[i]) orelse return error.TestUnexpectedResult;
                try out.append(env.gpa, .{ .cache = @intCast(cache), .sample_id = view.sample_ids.?[i] });
            }
        }
        return out.toOwnedSlice(env.gpa);
    }
};

/// Checks a schema field by field (names by content).
pub fn expectFields(want: []const schema.Field, got: []const schema.Field) !void {
    try testing.expectEqual(want.len, got.len);
    for (want, got) |w, g| {
        try testing.expectEqualStrings(w.name, g.name);
        try testing.expectEqual(w.kind, g.kind);
    }
}

/// Checks every column of sample `i` against the expected metadata object.
pub fn expectColumns(fields: []const schema.Field, view: batch_mod.View, i: usize, metadata: std.json.Value) !void {
    try testing.expectEqual(fields.len, view.columns.len);
    for (fields, view.columns) |f, col| {
        errdefer std.debug.print("column '{s}'\n", .{f.name});
        try testing.expectEqual(f.kind, col.kind);
        const want = metadata.object.get(f.name) orelse return error.TestUnexpectedResult;
        switch (f.kind) {
            .bool => {
                const values: [*]const u8 = @ptrCast(col.values.?);
                try testing.expectEqual(@as(u8, @intFromBool(want.bool)), values[i]);
            },
            .int => {
                const values: [*]const i64 = @ptrCast(@alignCast(col.values.?));
                try testing.expectEqual(want.integer, values[i]);
            },
            .float => {
                const values: [*]const f64 = @ptrCast(@alignCast(col.values.?));
                const w: f64 = switch (want) {
                    .float => |x| x,
                    .integer => |x| @floatFromInt(x),
                    else => return error.TestUnexpectedResult,
                };
                // Bit for bit: the reader must return every float exactly.
                try testing.expectEqual(@as(u64, @bitCast(w)), @as(u64, @bitCast(values[i])));
            },
            .string => {
                const bytes: [*]const u8 = @ptrCast(col.values.?);
                const offsets = col.offsets.?;
                try testing.expect(offsets[i] <= offsets[i + 1]);
                try testing.expectEqualStrings(want.string, bytes[@intCast(offsets[i])..@intCast(offsets[i + 1])]);
            },
        }
    }
}

/// Prints this thread's last message for an error a test did not expect, and returns it.
pub fn report(err: anytype, what: []const u8) @TypeOf(err) {
    std.debug.print("{s} failed: {s}: {s}\n", .{ what, @errorName(err), status.lastMessage() });
    return err;
}

/// Copies fixture `name` (manifest, index, metadata, shards) to `<dest>/<name>`.
pub fn copyFixture(gpa: std.mem.Allocator, dest: std.fs.Dir, name: []const u8) !void {
    const src_path = try fixturePath(gpa, name);
    defer gpa.free(src_path);
    var src = try std.fs.cwd().openDir(src_path, .{});
    defer src.close();
    var out = try dest.makeOpenPath(name, .{});
    defer out.close();
    for ([_][]const u8{ "manifest.json", "index.bin", "metadata.arrow" }) |file| try src.copyFile(file, out, file, .{});
    var src_shards = try src.openDir("shards", .{ .iterate = true });
    defer src_shards.close();
    var out_shards = try out.makeOpenPath("shards", .{});
    defer out_shards.close();
    var it = src_shards.iterate();
    while (try it.next()) |entry| try src_shards.copyFile(entry.name, out_shards, entry.name, .{});
}

/// Writes `<dest>/<name>`: a cache that opens without validate_cache, with these index
/// rows, shards of these lengths (sparse files of zeros: planning reads only the index and
/// the manifest, never the records), the fixture schema, zero checksums and an empty
/// metadata.arrow. Its cache id is the reference's for `name`.
pub fn writeSyntheticCache(gpa: std.mem.Allocator, dest: std.fs.Dir, name: []const u8, rows: []const index.Row, shard_lens: []const u64) !void {
    var dir = try dest.makeOpenPath(name, .{});
    defer dir.close();
    var shards_dir = try dir.makeOpenPath("shards", .{});
    defer shards_dir.close();
    const shards = try gpa.alloc(manifest.WriteShard, shard_lens.len);
    defer gpa.free(shards);
    for (shard_lens, shards, 0..) |len, *s, i| {
        var name_buf: [32]u8 = undefined;
        const file = try shards_dir.createFile(manifest.shardName(&name_buf, i), .{});
        defer file.close();
        try file.setEndPos(len);
        s.* = .{ .uncompressed_byte_len = len, .byte_len = len, .sha256 = @splat(0) };
    }
    var index_bytes: std.ArrayList(u8) = .empty;
    defer index_bytes.deinit(gpa);
    for (rows) |row| {
        std.debug.assert(row.shard_id < shard_lens.len);
        try index_bytes.appendSlice(gpa, &index.encode(row));
    }
    try dir.writeFile(.{ .sub_path = "index.bin", .data = index_bytes.items });
    try dir.writeFile(.{ .sub_path = "metadata.arrow", .data = "" });
    var text: std.ArrayList(u8) = .empty;
    defer text.deinit(gpa);
    try manifest.write(gpa, &text, .{
        .source_name = name,
        .sample_count = rows.len,
        .fields = &fixture_fields,
        .metadata_sha256 = @splat(0),
        .index_sha256 = @splat(0),
        .shards = shards,
        .compression = .none,
        .ratio = 1.0,
    });
    try dir.writeFile(.{ .sub_path = "manifest.json", .data = text.items });
}

/// The index rows of a cache directory. Caller frees.
pub fn readIndex(gpa: std.mem.Allocator, dir: std.fs.Dir, cache: []const u8) ![]index.Row {
    const path = try std.fs.path.join(gpa, &.{ cache, "index.bin" });
    defer gpa.free(path);
    const bytes = try dir.readFileAlloc(gpa, path, 1 << 24);
    defer gpa.free(bytes);
    const rows = try gpa.alloc(index.Row, bytes.len / index.row_bytes);
    for (rows, 0..) |*r, i| r.* = index.get(bytes, i);
    return rows;
}

/// Replaces the index rows of a cache directory (checksums are left stale: open it
/// without validate_cache).
pub fn writeIndex(gpa: std.mem.Allocator, dir: std.fs.Dir, cache: []const u8, rows: []const index.Row) !void {
    const path = try std.fs.path.join(gpa, &.{ cache, "index.bin" });
    defer gpa.free(path);
    var bytes: std.ArrayList(u8) = .empty;
    defer bytes.deinit(gpa);
    for (rows) |r| try bytes.appendSlice(gpa, &index.encode(r));
    try dir.writeFile(.{ .sub_path = path, .data = bytes.items });
}

/// The record image (length prefix, JSON, stored payload) of `loc`, read from its shard
/// file directly. Caller frees.
pub fn readRecord(gpa: std.mem.Allocator, ds: *const Dataset, loc: Loc) ![]u8 {
    const c = &ds.caches[loc.cache];
    const row = c.row(loc.sample_id);
    const file = try std.fs.cwd().openFile(c.shard_paths[@intCast(row.shard_id)], .{});
    defer file.close();
    const bytes = try gpa.alloc(u8, @intCast(row.byte_len));
    errdefer gpa.free(bytes);
    try testing.expectEqual(bytes.len, try file.preadAll(bytes, row.offset));
    return bytes;
}

/// Open file descriptors of this process (to check that a reader closes all of its own).
pub fn openFdCount() !usize {
    var dir = try std.fs.openDirAbsolute("/proc/self/fd", .{ .iterate = true });
    defer dir.close();
    var it = dir.iterate();
    var n: usize = 0;
    while (try it.next()) |_| n += 1;
    return n;
}

test "expected.json of every fixture parses and matches its cache's sample count" {
    const gpa = testing.allocator;
    var env = try Env.openFixtures(gpa, &same_schema, .{});
    defer env.close();
    try testing.expectEqual(env.ds.total(), env.total());
    for (env.ds.caches, env.cache_ids) |*c, id| try testing.expectEqual(id, c.cache_id);
    try testing.expectEqual(Loc{ .cache = 1, .sample_id = 0 }, env.pathOrder(120));
}
