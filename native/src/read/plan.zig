//! Planning reads: which stream positions an iterator reads (`Schedule`), and how the
//! next planned positions become one positioned read (`next`): one record, or in ordered
//! mode a run of records adjacent in one shard, coalesced up to `coalesce_bytes_max`.
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

/// Largest coalesced read in ordered mode.
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
/// `coalesce` extends the read over following records adjacent in the same shard.
/// A record reaching past its shard ends the run, so it fails alone after the ones
/// before it were delivered.
pub fn next(ds: *const Dataset, table: *const Table, schedule: Schedule, first: u64, limit: u64, coalesce: bool, locs: []Loc) Span {
    std.debug.assert(first < limit and limit <= schedule.count);
    std.debug.assert(limit - first <= locs.len);
    const loc = ds.locate(table, schedule.position(first));
    const c = &ds.caches[loc.cache];
    const row = c.row(loc.sample_id);
    locs[@intCast(first % locs.len)] = loc;
    var span: Span = .{ .first = first, .count = 1, .cache = loc.cache, .shard_id = row.shard_id, .offset = row.offset, .len = row.byte_len };
    if (!coalesce) return span;
    const shard_bytes = c.manifest.shards[@intCast(row.shard_id)].byte_len;
    while (first + span.count < limit and span.len < coalesce_bytes_max and span.len <= shard_bytes -| span.offset) {
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
