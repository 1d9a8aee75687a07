//! Plan-order look-ahead for caches whose shards are fetched (remote caches): an iterator
//! knows the positions it will read next, so it hands the shards of the next `span`
//! positions (sampler → index row → shard) to the cache's shard source (`ShardSource.
//! prefetch`, `io/remote.zig`), which fetches them in the background and pins them, with
//! bounded concurrency and bytes; a record of a shard read by byte ranges is handed on
//! by itself (`ShardSource.prefetch_range`): its range is fetched ahead. Every sampling
//! mode goes through the same code: ordered, shuffled, weighted, permutation, and
//! explicit schedules.
//!
//! Invariants:
//! - Each window index is handed on at most once per iterator (`cursor` only grows), and
//!   never further than `span` positions ahead of planning; consecutive positions in a
//!   recently handed shard cost one sampler draw and a compare (`recent`).
//! - When the source cannot take a shard now, the cursor stays there and the next `fill`
//!   asks again: look-ahead never skips a shard it could still fetch in time.
//! - Datasets with no fetched shards never draw a position here (`enabled` is false), nor
//!   do datasets whose fetched shards are all pinned already (`ShardSource.settled`),
//!   and a fill stops drawing as soon as the shard it handed on settles the last cache.
//! - Settling is final (a settled cache stays settled until it closes), so each cache is
//!   asked at most until it settles: `settled_below` only grows, and a fill costs O(1)
//!   checks however many caches the dataset has.

const std = @import("std");
const dataset_mod = @import("dataset.zig");
const plan = @import("plan.zig");
const Dataset = dataset_mod.Dataset;
const Table = dataset_mod.Table;

/// Positions looked at ahead of planning: at least this, or 4 prefetch windows.
pub const span_min = 1024;

pub const LookAhead = struct {
    /// Window indexes below this were handed on.
    cursor: u64 = 0,
    /// null until the first call: whether any cache's shards are fetched.
    enabled: ?bool = null,
    /// Caches below this index are settled or have no fetched shards (see `settled`).
    settled_below: usize = 0,
    /// Shards handed on last (cache, shard id), newest at `recent_at`.
    recent: [8]Key = @splat(.{ .cache = std.math.maxInt(u32), .shard_id = 0 }),
    recent_at: usize = 0,

    const Key = struct { cache: u32, shard_id: u64 };

    /// Hands on the shards of window indexes `[max(cursor, planned), planned + span)`.
    pub fn advance(la: *LookAhead, ds: *const Dataset, table: *const Table, schedule: plan.Schedule, planned: u64) void {
        const enabled = la.enabled orelse blk: {
            var any = false;
            for (ds.caches) |*c| {
                if (c.source) |src| any = any or src.prefetch != null;
            }
            la.enabled = any;
            break :blk any;
        };
        if (!enabled or table.len == 0 or la.settled(ds)) return;
        const span = @max(span_min, 4 * ds.options.prefetch_size);
        const end = @min(schedule.count, planned +| span);
        var k = @max(la.cursor, planned);
        while (k < end) : (k += 1) {
            const loc = ds.locate(table, schedule.position(k));
            const c = &ds.caches[loc.cache];
            const src = c.source orelse continue;
            const prefetch = src.prefetch orelse continue;
            const row = c.row(loc.sample_id);
            const shard_id = row.shard_id;
            if (shard_id >= c.manifest.shards.len) continue; // the read reports it
            if (src.prefetch_range) |ahead| switch (ahead(src.context, c, shard_id, row.offset, row.byte_len)) {
                .whole => {},
                .taken => continue,
                .full => break,
            };
            const key: Key = .{ .cache = loc.cache, .shard_id = shard_id };
            if (la.seen(key)) continue;
            if (!prefetch(src.context, c, shard_id)) break;
            la.recent_at = (la.recent_at + 1) % la.recent.len;
            la.recent[la.recent_at] = key;
            // The shard may have settled the first unsettled cache (a cached shard is
            // pinned right away), and with it the dataset: then nothing is left to hand
            // on, and the rest of the span is not located (a random index row per
            // position when shuffled).
            if (loc.cache == la.settled_below and la.settled(ds)) {
                k += 1;
                break;
            }
        }
        la.cursor = k;
    }

    /// Whether no cache has a shard left to fetch ahead (all pinned): then the positions
    /// are not located at all. Asks the first cache not known settled, and the ones after
    /// it while they are settled (`settled_below`).
    fn settled(la: *LookAhead, ds: *const Dataset) bool {
        while (la.settled_below < ds.caches.len) : (la.settled_below += 1) {
            const c = &ds.caches[la.settled_below];
            const src = c.source orelse continue;
            if (src.prefetch == null) continue;
            const is_settled = src.settled orelse return false;
            if (!is_settled(src.context, c)) return false;
        }
        return true;
    }

    fn seen(la: *const LookAhead, key: Key) bool {
        for (la.recent) |r| if (r.cache == key.cache and r.shard_id == key.shard_id) return true;
        return false;
    }
};

// ---------------------------------------------------------------- tests

const testing = std.testing;
const test_env = @import("testing.zig");
const cache_mod = @import("../store/cache.zig");

/// A shard source that pins every shard it is asked for at once (as a cached shard is)
/// and counts what the look-ahead asks.
const FakeSource = struct {
    pinned: [64]bool = @splat(false),
    pins: usize = 0,
    /// Settles once every shard is pinned; never when false.
    settles: bool = true,
    located: u64 = 0,
    settled_calls: u64 = 0,

    fn source(f: *FakeSource) cache_mod.ShardSource {
        return .{ .context = f, .open = open, .prefetch = prefetch, .prefetch_range = range, .settled = settled };
    }

    fn open(_: *anyopaque, _: *const cache_mod.Cache, _: u64) @import("../base/status.zig").Error!std.posix.fd_t {
        return error.Io; // never read here
    }

    fn prefetch(context: *anyopaque, _: *const cache_mod.Cache, shard_id: u64) bool {
        const f: *FakeSource = @ptrCast(@alignCast(context));
        if (!f.pinned[@intCast(shard_id)]) f.pins += 1;
        f.pinned[@intCast(shard_id)] = true;
        return true;
    }

    fn range(context: *anyopaque, _: *const cache_mod.Cache, _: u64, _: u64, _: u64) cache_mod.RangeAhead {
        const f: *FakeSource = @ptrCast(@alignCast(context));
        f.located += 1;
        return .whole;
    }

    fn settled(context: *anyopaque, c: *const cache_mod.Cache) bool {
        const f: *FakeSource = @ptrCast(@alignCast(context));
        f.settled_calls += 1;
        return f.settles and f.pins == c.manifest.shards.len;
    }
};

test "look-ahead: stops locating once the shard it hands on settles the dataset; asks a settled cache no more" {
    const gpa = testing.allocator;
    for ([_]bool{ false, true }) |shuffle| {
        var env = try test_env.Env.openFixtures(gpa, &.{ "plain_one_shard", "plain_many_shards" }, .{ .shuffle = shuffle });
        defer env.close();
        const ds = env.ds;
        const it = try env.openIter();
        defer it.close();
        try testing.expect(ds.caches[0].sampleCount() > 1 and ds.caches[1].manifest.shards.len > 1 and ds.caches[1].manifest.shards.len <= 64);
        try testing.expect(it.schedule.count <= span_min); // one fill sees every position

        // Only the one-shard cache is fetched: its first position pins its shard, which
        // settles the dataset, so nothing more is located, now or later.
        var one: FakeSource = .{};
        ds.caches[0].source = one.source();
        defer ds.caches[0].source = null;
        var la: LookAhead = .{};
        la.advance(ds, it.table, it.schedule, 0);
        try testing.expectEqual(@as(u64, 1), one.located);
        try testing.expectEqual(@as(usize, 1), one.pins);
        var first_k: u64 = 0; // the first position in the one-shard cache
        while (ds.locate(it.table, it.schedule.position(first_k)).cache != 0) first_k += 1;
        try testing.expectEqual(first_k + 1, la.cursor);
        la.advance(ds, it.table, it.schedule, 1);
        la.advance(ds, it.table, it.schedule, 5);
        try testing.expectEqual(@as(u64, 1), one.located);
        try testing.expectEqual(@as(u64, 2), one.settled_calls); // settled: asked no more

        // A cache that never settles: each of its positions in the span is handed on
        // once (the other cache's are located, but it fetches nothing).
        var never: FakeSource = .{ .settles = false };
        ds.caches[0].source = never.source();
        la = .{};
        la.advance(ds, it.table, it.schedule, 0);
        la.advance(ds, it.table, it.schedule, 3);
        var in_first: u64 = 0; // positions drawn in the one-shard cache
        for (0..it.schedule.count) |k| in_first += @intFromBool(ds.locate(it.table, it.schedule.position(k)).cache == 0);
        try testing.expectEqual(in_first, never.located);
        try testing.expectEqual(it.schedule.count, la.cursor);

        // Both fetched: the first cache settles at once and is not asked again; the
        // second settles when its last shard is pinned, and no position is located after.
        var a: FakeSource = .{};
        var b: FakeSource = .{};
        ds.caches[0].source = a.source();
        ds.caches[1].source = b.source();
        defer ds.caches[1].source = null;
        la = .{};
        la.advance(ds, it.table, it.schedule, 0);
        // (Shuffled with replacement, some shard may not be drawn in this window.)
        if (!shuffle) try testing.expectEqual(ds.caches[1].manifest.shards.len, b.pins);
        const located = a.located + b.located;
        try testing.expect(located <= it.schedule.count);
        try testing.expectEqual(@as(u64, 2), a.settled_calls);
        for (0..4) |i| la.advance(ds, it.table, it.schedule, i);
        try testing.expectEqual(located, a.located + b.located);
        try testing.expectEqual(@as(u64, 2), a.settled_calls);
    }
}
