//! Lookups: random access by identity (`get_item`), read synchronously on the calling
//! thread through the I/O layer's positioned read; no cursor moves.
//!
//! Invariant: batch pointers into `raw` are taken only after every record of the call was
//! read, so `raw` no longer moves; they stay valid until the next call on the lookup.

const std = @import("std");
const status = @import("../base/status.zig");
const shard = @import("../format/shard.zig");
const io = @import("../io/backend.zig");
const files_mod = @import("../io/files.zig");
const dataset_mod = @import("dataset.zig");
const batch_mod = @import("batch.zig");
const record = @import("record.zig");
const Dataset = dataset_mod.Dataset;

pub const Lookup = struct {
    ds: *Dataset,
    files: files_mod.Files = .{},
    record: std.ArrayList(u8) = .empty,
    raw: std.ArrayList(u8) = .empty,
    /// (start, len) of each sample's payload and JSON in `raw`, filled before batching so
    /// that pointers into `raw` are taken only after it stops growing.
    spans: std.ArrayList([2]u64) = .empty,
    jsons: std.ArrayList([2]u64) = .empty,
    batch: batch_mod.Buffers,

    pub fn open(ds: *Dataset) status.Error!*Lookup {
        try ds.runtime.checkPid();
        var batch = try batch_mod.Buffers.init(ds.gpa, ds.fields.len);
        errdefer batch.deinit(ds.gpa);
        const lk = try ds.gpa.create(Lookup);
        lk.* = .{ .ds = ds.retain(), .batch = batch };
        return lk;
    }

    /// The samples with these identities, in this order; the first bad identity or
    /// unreadable record fails the whole call.
    pub fn get(lk: *Lookup, cache_ids: []const u64, sample_ids: []const u64, contiguous: bool) status.Error!batch_mod.View {
        std.debug.assert(cache_ids.len == sample_ids.len);
        const ds = lk.ds;
        const gpa = ds.gpa;
        try ds.runtime.checkPid();
        lk.raw.clearRetainingCapacity();
        lk.spans.clearRetainingCapacity();
        lk.jsons.clearRetainingCapacity();
        // Pass 1: read each record; keep JSON and (decompressed) payload bytes in `raw`.
        for (cache_ids, sample_ids) |cid, sid| {
            const loc = try ds.locFor(cid, sid);
            const c = &ds.caches[loc.cache];
            const row = c.row(loc.sample_id);
            const path = c.shard_paths[@intCast(row.shard_id)];
            const shard_len = c.manifest.shards[@intCast(row.shard_id)].byte_len;
            if (row.offset > shard_len or row.byte_len > shard_len - row.offset) {
                return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path});
            }
            try record.growUninit(&lk.record, gpa, @intCast(row.byte_len));
            const handle = try lk.files.acquire(.{ .cache = loc.cache, .shard_id = row.shard_id }, Dataset.ShardOpener{ .ds = ds });
            defer lk.files.release(handle);
            switch (io.readAll(handle.fd, lk.record.items, row.offset)) {
                .ok => {},
                .eof => return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{path}),
                .os => |e| return status.failErrno(e, path),
                .pending => unreachable,
            }
            ds.countRead(null, row.byte_len);
            const rec = try shard.split(lk.record.items);
            try lk.jsons.append(gpa, .{ lk.raw.items.len, rec.json.len });
            try lk.raw.appendSlice(gpa, rec.json);
            const payload_at = lk.raw.items.len;
            switch (c.manifest.shards[@intCast(row.shard_id)].compression) {
                .none => try lk.raw.appendSlice(gpa, rec.stored_payload),
                .lz4 => _ = try record.appendDecompressed(&lk.raw, gpa, rec.stored_payload),
            }
            try lk.spans.append(gpa, .{ payload_at, lk.raw.items.len - payload_at });
        }
        // Pass 2: parse and batch, now that `raw` no longer moves.
        std.debug.assert(lk.jsons.items.len == cache_ids.len and lk.spans.items.len == cache_ids.len);
        const raw = lk.raw.items;
        try lk.batch.reset(gpa, ds.fields);
        for (cache_ids, sample_ids, lk.jsons.items, lk.spans.items) |cid, sid, j, p| {
            const loc = try ds.locFor(cid, sid);
            const json = raw[@intCast(j[0])..][0..@intCast(j[1])];
            const payload = raw[@intCast(p[0])..][0..@intCast(p[1])];
            try lk.batch.add(ds, loc, json, payload);
        }
        std.debug.assert(lk.raw.items.ptr == raw.ptr and lk.raw.items.len == raw.len);
        if (contiguous) try lk.batch.pack(gpa, 0);
        return lk.batch.view(ds.fields, contiguous);
    }

    pub fn close(lk: *Lookup) void {
        const ds = lk.ds;
        if (ds.runtime.checkPid()) |_| {} else |_| return;
        const gpa = ds.gpa;
        lk.files.deinit();
        lk.record.deinit(gpa);
        lk.raw.deinit(gpa);
        lk.spans.deinit(gpa);
        lk.jsons.deinit(gpa);
        lk.batch.deinit(gpa);
        gpa.destroy(lk);
        ds.release();
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;
const helpers = @import("testing.zig");
const Loc = dataset_mod.Loc;

/// Gets `locs` in one call and checks every sample against expected.json.
fn expectGet(env: *const helpers.Env, lk: *Lookup, locs: []const Loc, contiguous: bool) !void {
    const gpa = testing.allocator;
    const cids = try gpa.alloc(u64, locs.len);
    defer gpa.free(cids);
    const sids = try gpa.alloc(u64, locs.len);
    defer gpa.free(sids);
    for (locs, cids, sids) |loc, *c, *s| {
        c.* = env.cache_ids[loc.cache];
        s.* = loc.sample_id;
    }
    const view = lk.get(cids, sids, contiguous) catch |err| return helpers.report(err, "Lookup.get");
    try testing.expectEqual(@as(u64, locs.len), view.count);
    try testing.expectEqual(contiguous, view.payload_base != null);
    for (locs, 0..) |loc, i| try env.expectSample(view, i, loc);
}

test "lookup: identities in any order, repeated, across caches, contiguous or not" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &helpers.same_schema, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();

    const total = env.total();
    const in_order = try gpa.alloc(Loc, @intCast(total));
    defer gpa.free(in_order);
    for (in_order, 0..) |*loc, flat| loc.* = env.pathOrder(flat);
    const reversed = try gpa.dupe(Loc, in_order);
    defer gpa.free(reversed);
    std.mem.reverse(Loc, reversed);
    // Random identities with repeats, lz4 and plain caches interleaved.
    var prng = std.Random.DefaultPrng.init(11);
    var random: [300]Loc = undefined;
    for (&random) |*loc| loc.* = in_order[prng.random().uintLessThan(usize, in_order.len)];
    const few = [_]Loc{ .{ .cache = 2, .sample_id = 299 }, .{ .cache = 0, .sample_id = 0 }, .{ .cache = 2, .sample_id = 299 }, .{ .cache = 3, .sample_id = 4 } };

    var reads: u64 = 0;
    for ([_]bool{ false, true }) |contiguous| {
        for ([_][]const Loc{ in_order, reversed, &random, &few, few[0..1] }) |locs| {
            try expectGet(&env, lk, locs, contiguous);
            reads += locs.len;
        }
        // Nothing asked, nothing read.
        try testing.expectEqual(@as(u64, 0), (try lk.get(&.{}, &.{}, contiguous)).count);
    }
    // One read per identity, counted as lookup reads.
    const stats = env.ds.ioStats();
    try testing.expectEqual(reads, stats.lookup_reads);
    try testing.expectEqual(@as(u64, 0), stats.uring_reads + stats.pool_reads);
}

test "lookup: an unknown cache id or sample id fails with error.Index and the reference's message" {
    const gpa = testing.allocator;
    var env = try helpers.Env.openFixtures(gpa, &.{ "plain_one_shard", "unicode_é_name" }, .{});
    defer env.close();
    const lk = try Lookup.open(env.ds);
    defer lk.close();
    const a = env.cache_ids[0];
    const b = env.cache_ids[1];

    try testing.expectError(error.Index, lk.get(&.{123}, &.{0}, false));
    try testing.expectEqualStrings("cache_id 123 is out of range", status.lastMessage());

    try testing.expectError(error.Index, lk.get(&.{a}, &.{120}, true));
    var buf: [128]u8 = undefined;
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "sample_id 120 is out of range for cache_id {d}", .{a}), status.lastMessage());

    // One bad identity fails the whole call, wherever it is.
    try testing.expectError(error.Index, lk.get(&.{ a, b, b }, &.{ 0, 9, 10 }, false));
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "sample_id 10 is out of range for cache_id {d}", .{b}), status.lastMessage());
    try testing.expectError(error.Index, lk.get(&.{ a, std.math.maxInt(u64) }, &.{ 0, 0 }, false));
    try testing.expectEqualStrings("cache_id 18446744073709551615 is out of range", status.lastMessage());

    // The lookup stays usable.
    try expectGet(&env, lk, &.{ .{ .cache = 1, .sample_id = 9 }, .{ .cache = 0, .sample_id = 119 } }, false);
}
