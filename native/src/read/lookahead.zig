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
//!   do datasets whose fetched shards are all pinned already (`ShardSource.settled`).

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
        if (!enabled or table.len == 0 or settled(ds)) return;
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
        }
        la.cursor = k;
    }

    /// Whether no cache has a shard left to fetch ahead (all pinned): then the positions
    /// are not located at all (a random index row per position when shuffled). The
    /// cursor stays: when a cache unsettles, handing on resumes at the planning point.
    fn settled(ds: *const Dataset) bool {
        for (ds.caches) |*c| {
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
