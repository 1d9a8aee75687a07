//! Planning reads: which stream positions an iterator reads (`Schedule`), and how the
//! next planned positions become one positioned read (`next`): one record, or in ordered
//! mode a run of records adjacent in one shard, coalesced up to a byte size the iterator
//! chooses (at most `coalesce_bytes_max`; 0 reads every record alone).
//!
//! Invariants:
//! - A span covers window indexes `[first, first + count)` with `count >= 1`, all in one
//!   cache and shard, whose records are back to back: `len` is the sum of their lengths.
//! - `next` never plans at or past `limit`, so the caller's prefetch bound holds.

const std = @import("std");
const status = @import("../base/status.zig");
const dataset_mod = @import("dataset.zig");
const Dataset = dataset_mod.Dataset;
const Loc = dataset_mod.Loc;
const Table = dataset_mod.Table;

/// A coalesced read stops growing once it reaches its size bound, at most this (its last
/// record may take it past the bound, by less than one record).
pub const coalesce_bytes_max = 4 << 20;

/// Which stream positions an iterator reads: window index k (< count) maps to
/// `start + (k / block_len) * block_stride + k % block_len`; block_len 0 means contiguous
/// (`start + k`). Blocks of `block_len` positions every `block_stride` let one consumer of
/// several read its share of a global stream (batch b of every `stride / len`-th).
pub const Schedule = struct {
    start: u64,
    count: u64,
    block_len: u64 = 0,
    block_stride: u64 = 0,

    pub fn position(s: Schedule, k: u64) u64 {
        if (s.block_len == 0) return s.start +% k;
        return s.start +% (k / s.block_len) *% s.block_stride +% (k % s.block_len);
    }

    pub fn validate(s: Schedule) status.Error!void {
        if (s.block_len != 0 and s.block_stride < s.block_len) {
            return status.fail(error.InvalidArgument, "block_stride {d} is smaller than block_len {d}", .{ s.block_stride, s.block_len });
        }
    }
};

/// One positioned read: `count` consecutive window indexes from `first`.
pub const Span = struct {
    first: u64,
    count: u32,
    cache: u32,
    shard_id: u64,
    offset: u64,
    len: u64,
};

/// Plans the read that starts at window index `first` (< `limit`): locates each position
/// (sampler → index row), stores its location in `locs[index % locs.len]`, and with
/// `coalesce > 0` extends the read over following records adjacent in the same shard
/// while it is shorter than `coalesce` bytes.
/// A record reaching past its shard ends the run, so it fails alone after the ones
/// before it were delivered.
pub fn next(ds: *const Dataset, table: *const Table, schedule: Schedule, first: u64, limit: u64, coalesce: u64, locs: []Loc) Span {
    return nextFrom(ds, table, schedule, first, ds.locate(table, schedule.position(first)), limit, coalesce, locs);
}

/// `next`, with the location of window index `first` already known (`loc`).
pub fn nextFrom(ds: *const Dataset, table: *const Table, schedule: Schedule, first: u64, loc: Loc, limit: u64, coalesce: u64, locs: []Loc) Span {
    std.debug.assert(first < limit and limit <= schedule.count);
    std.debug.assert(limit - first <= locs.len);
    const c = &ds.caches[loc.cache];
    const row = c.row(loc.sample_id);
    locs[@intCast(first % locs.len)] = loc;
    var span: Span = .{ .first = first, .count = 1, .cache = loc.cache, .shard_id = row.shard_id, .offset = row.offset, .len = row.byte_len };
    if (coalesce == 0) return span;
    const shard_bytes = c.manifest.shards[@intCast(row.shard_id)].byte_len;
    while (first + span.count < limit and span.len < coalesce and span.len <= shard_bytes -| span.offset) {
        const at = first + span.count;
        const following = ds.locate(table, schedule.position(at));
        if (following.cache != loc.cache) break;
        const r = c.row(following.sample_id);
        if (r.shard_id != row.shard_id or r.offset != span.offset + span.len) break;
        if (r.byte_len > shard_bytes -| r.offset) break;
        span.len += r.byte_len;
        span.count += 1;
        locs[@intCast(at % locs.len)] = following;
    }
    std.debug.assert(span.count >= 1 and first + span.count <= limit);
    return span;
}

test "schedule positions" {
    const contiguous: Schedule = .{ .start = 10, .count = 5 };
    try std.testing.expectEqual(@as(u64, 14), contiguous.position(4));
    // Batches of 2 of every third batch, starting at batch 1: 2 3 | 8 9 | 14 15.
    const strided: Schedule = .{ .start = 2, .count = 6, .block_len = 2, .block_stride = 6 };
    const want = [_]u64{ 2, 3, 8, 9, 14, 15 };
    for (want, 0..) |w, k| try std.testing.expectEqual(w, strided.position(k));
    // A stride equal to the block length is contiguous.
    const same: Schedule = .{ .start = 7, .count = 9, .block_len = 3, .block_stride = 3 };
    for (0..9) |k| try std.testing.expectEqual(7 + @as(u64, k), same.position(k));
    // Positions wrap like the stream counter does.
    const wrap: Schedule = .{ .start = std.math.maxInt(u64), .count = 2 };
    try std.testing.expectEqual(@as(u64, 0), wrap.position(1));
    try std.testing.expectError(error.InvalidArgument, (Schedule{ .start = 0, .count = 1, .block_len = 4, .block_stride = 3 }).validate());
}

// ---------------------------------------------------------------- tests on caches

const testing = std.testing;
const helpers = @import("testing.zig");
const index = @import("../format/index.zig");

/// Checks the span invariants of the header against the index: `count >= 1` window
/// indexes from `first`, each located where the sampler says (and stored in `locs`), all
/// in one cache and shard, back to back from `offset`, with `len` their total length.
fn expectWellFormed(ds: *const Dataset, schedule: Schedule, span: Span, locs: []const Loc) !void {
    try testing.expect(span.count >= 1);
    var offset = span.offset;
    for (0..span.count) |j| {
        const at = span.first + j;
        const loc = locs[@intCast(at % locs.len)];
        try testing.expectEqual(ds.locate(ds.table, schedule.position(at)), loc);
        try testing.expectEqual(span.cache, loc.cache);
        const row = ds.caches[loc.cache].row(loc.sample_id);
        try testing.expectEqual(span.shard_id, row.shard_id);
        try testing.expectEqual(offset, row.offset);
        offset += row.byte_len;
    }
    try testing.expectEqual(span.offset + span.len, offset);
}

/// Plans a whole window the way an iterator with `locs.len` prefetch does; returns the
/// count of each read, checked with `expectWellFormed`. Caller frees.
fn planWindow(ds: *const Dataset, schedule: Schedule, coalesce: u64, locs: []Loc) ![]u32 {
    var counts: std.ArrayList(u32) = .empty;
    errdefer counts.deinit(testing.allocator);
    var first: u64 = 0;
    while (first < schedule.count) {
        const limit = @min(schedule.count, first + locs.len);
        const span = next(ds, ds.table, schedule, first, limit, coalesce, locs);
        try testing.expectEqual(first, span.first);
        try testing.expect(first + span.count <= limit);
        try expectWellFormed(ds, schedule, span, locs);
        try counts.append(testing.allocator, span.count);
        first += span.count;
    }
    return counts.toOwnedSlice(testing.allocator);
}

test "plan: shuffled mode (no coalescing) plans one record per read" {
    var env = try helpers.Env.openFixtures(testing.allocator, &.{ "plain_one_shard", "plain_many_shards" }, .{ .shuffle = true });
    defer env.close();
    const ds = env.ds;
    const schedule: Schedule = .{ .start = 5, .count = 200 };
    var locs: [16]Loc = undefined;
    for (0..schedule.count) |first| {
        const limit = @min(schedule.count, first + locs.len);
        const span = next(ds, ds.table, schedule, first, limit, 0, &locs);
        try testing.expectEqual(@as(u32, 1), span.count);
        const loc = ds.locate(ds.table, schedule.position(first));
        try testing.expectEqual(loc, locs[first % locs.len]);
        const row = ds.caches[loc.cache].row(loc.sample_id);
        try testing.expectEqual(loc.cache, span.cache);
        try testing.expectEqual(row.shard_id, span.shard_id);
        try testing.expectEqual(row.offset, span.offset);
        try testing.expectEqual(row.byte_len, span.len);
    }
}

test "plan: without coalescing even adjacent records are read one by one" {
    var env = try helpers.Env.openFixtures(testing.allocator, &.{"plain_one_shard"}, .{});
    defer env.close();
    var locs: [8]Loc = undefined;
    const counts = try planWindow(env.ds, .{ .start = 0, .count = 120 }, 0, &locs);
    defer testing.allocator.free(counts);
    try testing.expectEqual(@as(usize, 120), counts.len);
    for (counts) |c| try testing.expectEqual(@as(u32, 1), c);
}

test "plan: ordered mode coalesces adjacent records of a shard, never past the limit" {
    var env = try helpers.Env.openFixtures(testing.allocator, &.{"plain_one_shard"}, .{});
    defer env.close();
    const ds = env.ds;
    const c = &ds.caches[0];
    const schedule: Schedule = .{ .start = 0, .count = 120 };
    var locs: [120]Loc = undefined;
    // The whole single-shard cache is one run of back-to-back records.
    const all = next(ds, ds.table, schedule, 0, 120, coalesce_bytes_max, &locs);
    try expectWellFormed(ds, schedule, all, &locs);
    try testing.expectEqual(@as(u32, 120), all.count);
    try testing.expectEqual(@as(u64, 0), all.offset);
    try testing.expectEqual(c.manifest.shards[0].byte_len, all.len);
    // The limit ends a run: [3, 10) is seven records.
    const part = next(ds, ds.table, schedule, 3, 10, coalesce_bytes_max, &locs);
    try expectWellFormed(ds, schedule, part, &locs);
    try testing.expectEqual(@as(u32, 7), part.count);
    try testing.expectEqual(c.row(3).offset, part.offset);
    // Every limit is honoured exactly when all records are adjacent.
    var limit: u64 = 1;
    while (limit <= 120) : (limit += 7) {
        const span = next(ds, ds.table, schedule, 0, limit, coalesce_bytes_max, &locs);
        try testing.expectEqual(limit, span.count);
    }
    try testing.expectEqual(@as(u32, 1), next(ds, ds.table, schedule, 119, 120, coalesce_bytes_max, &locs).count);
    // A window that wraps past the last sample: 115..119, then 0..4 from offset 0.
    const wrapping: Schedule = .{ .start = 115, .count = 10 };
    const tail = next(ds, ds.table, wrapping, 0, 10, coalesce_bytes_max, &locs);
    try expectWellFormed(ds, wrapping, tail, &locs);
    try testing.expectEqual(@as(u32, 5), tail.count);
    try testing.expectEqual(c.manifest.shards[0].byte_len, tail.offset + tail.len);
    const head = next(ds, ds.table, wrapping, 5, 10, coalesce_bytes_max, &locs);
    try expectWellFormed(ds, wrapping, head, &locs);
    try testing.expectEqual(@as(u32, 5), head.count);
    try testing.expectEqual(@as(u64, 0), head.offset);
}

test "plan: a shard boundary ends a read" {
    var env = try helpers.Env.openFixtures(testing.allocator, &.{"plain_many_shards"}, .{});
    defer env.close();
    const c = &env.ds.caches[0];
    var locs: [300]Loc = undefined;
    const counts = try planWindow(env.ds, .{ .start = 0, .count = 300 }, coalesce_bytes_max, &locs);
    defer testing.allocator.free(counts);
    // One read per shard, covering exactly the shard's records (they fill it).
    try testing.expectEqual(c.manifest.shards.len, counts.len);
    var sample: u64 = 0;
    for (counts, c.manifest.shards, 0..) |count, shard_entry, shard_id| {
        var in_shard: u64 = 0;
        for (0..c.sampleCount()) |s| in_shard += @intFromBool(c.row(s).shard_id == shard_id);
        try testing.expectEqual(in_shard, count);
        try testing.expectEqual(@as(u64, 0), c.row(sample).offset);
        const last = c.row(sample + count - 1);
        try testing.expectEqual(shard_entry.byte_len, last.offset + last.byte_len);
        sample += count;
    }
}

test "plan: a cache boundary ends a read even where the next record is adjacent" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // "tail": plain_one_shard without its first 10 samples, so its sample 0 starts at
    // byte 6212 of shard 0, exactly where unicode_é_name's last record ends.
    try helpers.copyFixture(gpa, tmp.dir, "plain_one_shard");
    const rows = try helpers.readIndex(gpa, tmp.dir, "plain_one_shard");
    defer gpa.free(rows);
    try helpers.writeIndex(gpa, tmp.dir, "plain_one_shard", rows[10..]);
    const text = try tmp.dir.readFileAlloc(gpa, "plain_one_shard/manifest.json", 1 << 20);
    defer gpa.free(text);
    const edited = try std.mem.replaceOwned(u8, gpa, text, "\"sample_count\": 120", "\"sample_count\": 110");
    defer gpa.free(edited);
    try tmp.dir.writeFile(.{ .sub_path = "plain_one_shard/manifest.json", .data = edited });

    const first_path = try helpers.fixturePath(gpa, "unicode_é_name");
    defer gpa.free(first_path);
    const tail_path = try tmp.dir.realpathAlloc(gpa, "plain_one_shard");
    defer gpa.free(tail_path);
    var env = try helpers.Env.open(gpa, &.{ first_path, tail_path }, null, .{});
    defer env.close();
    const ds = env.ds;
    const last = ds.caches[0].row(9);
    const following = ds.caches[1].row(0);
    try testing.expectEqual(last.shard_id, following.shard_id);
    try testing.expectEqual(last.offset + last.byte_len, following.offset);

    var locs: [120]Loc = undefined;
    const counts = try planWindow(ds, .{ .start = 0, .count = 120 }, coalesce_bytes_max, &locs);
    defer gpa.free(counts);
    try testing.expectEqualSlices(u32, &.{ 10, 110 }, counts);

    // The next cache's record is looked up in its own index: "rotated", unicode_é_name
    // with its first record moved last, ends at byte 66, where its own sample 0 starts
    // but the next cache's does not.
    try helpers.copyFixture(gpa, tmp.dir, "unicode_é_name");
    const unicode_rows = try helpers.readIndex(gpa, tmp.dir, "unicode_é_name");
    defer gpa.free(unicode_rows);
    std.mem.rotate(index.Row, unicode_rows, 1);
    try helpers.writeIndex(gpa, tmp.dir, "unicode_é_name", unicode_rows);
    const rotated_path = try tmp.dir.realpathAlloc(gpa, "unicode_é_name");
    defer gpa.free(rotated_path);
    var rotated = try helpers.Env.open(gpa, &.{ rotated_path, tail_path }, null, .{});
    defer rotated.close();
    try testing.expectEqual(rotated.ds.caches[0].row(0).offset, rotated.ds.caches[0].row(9).byte_len);
    const rotated_counts = try planWindow(rotated.ds, .{ .start = 0, .count = 120 }, coalesce_bytes_max, &locs);
    defer gpa.free(rotated_counts);
    try testing.expectEqualSlices(u32, &.{ 9, 1, 110 }, rotated_counts);
}

test "plan: a non-adjacent offset ends a read" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // Samples 1 and 2 swap records: 0 | 1 (at 185) | 2 (at 66) | 3.. back to back.
    try helpers.copyFixture(gpa, tmp.dir, "plain_one_shard");
    const rows = try helpers.readIndex(gpa, tmp.dir, "plain_one_shard");
    defer gpa.free(rows);
    std.mem.swap(index.Row, &rows[1], &rows[2]);
    try helpers.writeIndex(gpa, tmp.dir, "plain_one_shard", rows);
    const path = try tmp.dir.realpathAlloc(gpa, "plain_one_shard");
    defer gpa.free(path);
    var env = try helpers.Env.open(gpa, &.{path}, null, .{});
    defer env.close();
    var locs: [120]Loc = undefined;
    const counts = try planWindow(env.ds, .{ .start = 0, .count = 120 }, coalesce_bytes_max, &locs);
    defer gpa.free(counts);
    try testing.expectEqualSlices(u32, &.{ 1, 1, 1, 117 }, counts);
}

test "plan: a read stops growing once it reaches coalesce_bytes_max" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // Records of 1 MiB and of 1.5 MiB, back to back in one (sparse) shard each.
    const mib = 1 << 20;
    var even: [12]index.Row = undefined;
    for (&even, 0..) |*r, i| r.* = .{ .shard_id = 0, .offset = i * mib, .byte_len = mib };
    try helpers.writeSyntheticCache(gpa, tmp.dir, "even", &even, &.{12 * mib});
    var odd: [6]index.Row = undefined;
    for (&odd, 0..) |*r, i| r.* = .{ .shard_id = 0, .offset = i * (3 * mib / 2), .byte_len = 3 * mib / 2 };
    try helpers.writeSyntheticCache(gpa, tmp.dir, "odd", &odd, &.{9 * mib});
    var huge = [_]index.Row{ .{ .shard_id = 0, .offset = 0, .byte_len = 5 * mib }, .{ .shard_id = 0, .offset = 5 * mib, .byte_len = 1 } };
    try helpers.writeSyntheticCache(gpa, tmp.dir, "huge", &huge, &.{5 * mib + 1});

    const Case = struct { name: []const u8, count: u64, want: []const u32 };
    const cases = [_]Case{
        // Four 1 MiB records reach the maximum exactly.
        .{ .name = "even", .count = 12, .want = &.{ 4, 4, 4 } },
        // A run stops at the first record that takes it to or past the maximum, so a
        // read may exceed coalesce_bytes_max by less than one record (4.5 MiB here).
        .{ .name = "odd", .count = 6, .want = &.{ 3, 3 } },
        // A record larger than the maximum is read alone.
        .{ .name = "huge", .count = 2, .want = &.{ 1, 1 } },
    };
    for (cases) |case| {
        const path = try tmp.dir.realpathAlloc(gpa, case.name);
        defer gpa.free(path);
        var env = try helpers.Env.open(gpa, &.{path}, null, .{});
        defer env.close();
        var locs: [16]Loc = undefined;
        const counts = try planWindow(env.ds, .{ .start = 0, .count = case.count }, coalesce_bytes_max, &locs);
        defer gpa.free(counts);
        try testing.expectEqualSlices(u32, case.want, counts);
    }
}

test "plan: a record reaching past its shard ends the run before it and is planned alone" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const rows = [_]index.Row{
        .{ .shard_id = 0, .offset = 0, .byte_len = 100 },
        .{ .shard_id = 0, .offset = 100, .byte_len = 100 },
        .{ .shard_id = 0, .offset = 200, .byte_len = 900 }, // ends at 1100 > 1000
        .{ .shard_id = 0, .offset = 1100, .byte_len = 10 }, // starts past the end
    };
    try helpers.writeSyntheticCache(gpa, tmp.dir, "past_end", &rows, &.{1000});
    const path = try tmp.dir.realpathAlloc(gpa, "past_end");
    defer gpa.free(path);
    var env = try helpers.Env.open(gpa, &.{path}, null, .{});
    defer env.close();
    var locs: [4]Loc = undefined;
    const counts = try planWindow(env.ds, .{ .start = 0, .count = 4 }, coalesce_bytes_max, &locs);
    defer gpa.free(counts);
    try testing.expectEqualSlices(u32, &.{ 2, 1, 1 }, counts);
}
