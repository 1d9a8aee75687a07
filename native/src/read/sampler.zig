//! The shuffled draw stream of dataset-rt 0.4.8 (dataset-rt-0.4.8.md section 3.3).
//!
//! Draw `d` of a dataset's stream uses a fresh ChaCha8 generator seeded with
//! `seed ^ rotl64(d, 32)`, then picks a row either uniformly (rand 0.8 `gen_range(0..n)`)
//! or by weight (rand 0.8 `WeightedIndex<f64>`). Both are bit-exact with the reference
//! release; `/work/shared/reference/sampler_model.py` is the executable model the golden
//! vectors below come from.

const std = @import("std");
const ChaCha8 = @import("../codec/chacha.zig").ChaCha8;

/// The generator seed of draw `draw`: `seed ^ rotl64(draw, 32)`.
pub fn drawSeed(seed: u64, draw: u64) u64 {
    return seed ^ std.math.rotl(u64, draw, 32);
}

/// rand 0.8 `gen_range(0..n)` (u64 widening multiply with the rejection zone), fresh RNG for draw d.
/// `zone = (n << leading_zeros(n)) - 1`; take `v = next_u64` until the low half of the
/// 128-bit product `v * n` is `<= zone`, and return the high half.
pub fn uniformDraw(seed: u64, draw: u64, n: u64) u64 {
    std.debug.assert(n > 0);
    var rng = ChaCha8.seedFromU64(drawSeed(seed, draw));
    const zone = (n << @intCast(@clz(n))) -% 1;
    while (true) {
        const product = @as(u128, rng.nextU64()) * n;
        if (@as(u64, @truncate(product)) <= zone) return @intCast(product >> 64);
    }
}

/// `1 - 2^-52`, the largest value of rand's `[0, 1)` f64 (52 random mantissa bits).
const max_rand: f64 = @as(f64, @bitCast((~@as(u64, 0) >> 12) | 0x3FF0000000000000)) - 1.0;

/// rand 0.8 WeightedIndex<f64>, built in O(n), sampled in O(log n).
pub const WeightedTable = struct {
    cumulative: []f64, // running sums of all weights except the last (len n-1)
    total: f64,
    scale: f64, // UniformFloat scale, lowered ulp by ulp while scale*max_rand >= total

    /// Sums are accumulated left to right in f64, in the given order (never sorted), as
    /// rand does. `InvalidWeights` when `weights` is empty, a weight is negative, NaN or
    /// infinite, or the total is not finite and positive (all zero, or overflow). Callers
    /// validate first with their own messages; this is a safety net.
    pub fn init(gpa: std.mem.Allocator, weights: []const f64) error{ OutOfMemory, InvalidWeights }!WeightedTable {
        if (weights.len == 0) return error.InvalidWeights;
        for (weights) |w| {
            if (!(w >= 0.0) or !std.math.isFinite(w)) return error.InvalidWeights;
        }
        const cumulative = try gpa.alloc(f64, weights.len - 1);
        errdefer gpa.free(cumulative);
        var running: f64 = 0.0;
        for (weights[0 .. weights.len - 1], cumulative) |w, *c| {
            running += w;
            c.* = running;
        }
        const total = running + weights[weights.len - 1];
        if (!(total > 0.0) or !std.math.isFinite(total)) return error.InvalidWeights;
        // rand's UniformFloat::new(0, total): lower scale one ulp at a time until the
        // largest sample stays below total.
        var scale = total;
        while (scale * max_rand >= total) {
            scale = @bitCast(@as(u64, @bitCast(scale)) - 1);
        }
        return .{ .cumulative = cumulative, .total = total, .scale = scale };
    }

    pub fn deinit(self: *WeightedTable, gpa: std.mem.Allocator) void {
        gpa.free(self.cumulative);
        self.* = undefined;
    }

    /// Row index chosen by draw `d` of the stream for `seed`: `x` uniform in `[0, total)`
    /// from one `next_u64`, then `bisect_right(cumulative, x)`.
    pub fn draw(self: *const WeightedTable, seed: u64, d: u64) usize {
        // A single row is always chosen; the draw's generator is discarded anyway.
        if (self.cumulative.len == 0) return 0;
        var rng = ChaCha8.seedFromU64(drawSeed(seed, d));
        const value1_2: f64 = @bitCast((rng.nextU64() >> 12) | 0x3FF0000000000000);
        const x = (value1_2 - 1.0) * self.scale;
        return bisectRight(self.cumulative, x);
    }
};

/// Number of leading elements of the non-decreasing `sorted` that are `<= x`: the first
/// index whose value is greater than `x` (rand's `binary_search_by(..).unwrap_err()`; the
/// partition point is unique, so any correct binary search gives the same index).
///
/// Branchless halving with both possible next probes prefetched: on tables far larger than
/// the caches (10M rows) the draw is bound by memory latency, not by comparisons.
fn bisectRight(sorted: []const f64, x: f64) usize {
    if (sorted.len == 0) return 0;
    // Invariant: the answer lies in [base, base + len].
    var base: usize = 0;
    var len: usize = sorted.len;
    while (len > 1) {
        const half = len / 2;
        @prefetch(sorted.ptr + base + half / 2, .{});
        @prefetch(sorted.ptr + base + half + half / 2, .{});
        base += @as(usize, @intFromBool(sorted[base + half] <= x)) * half;
        len -= half;
    }
    return base + @intFromBool(sorted[base] <= x);
}

// ---------------------------------------------------------------------------------------
// Tests

const testing = std.testing;

/// Permutation sampling (an extension; not in dataset-rt 0.4.8): the shuffled stream is
/// a sequence of passes over the `n` active rows, each a seeded permutation. The row at
/// stream position `p` is `Permutation.at(n, seed, p)`: pass `p / n`, index `p % n`
/// through a keyed bijection of [0, n), so any position is computable in O(1) expected
/// time (no table), which keeps resuming and rank splitting exact.
///
/// The bijection is a 6-round balanced Feistel network over the smallest even number of
/// bits covering n, keyed per pass, with cycle walking: values that land outside
/// [0, n) are permuted again until they fall inside. The domain is below 4n, so the
/// expected number of walks is under 4.
pub const Permutation = struct {
    pub fn at(n: u64, seed: u64, p: u64) u64 {
        std.debug.assert(n > 0);
        if (n == 1) return 0;
        const pass = p / n;
        const index = p % n;
        const key = mix64(seed ^ mix64(pass +% 0x9E3779B97F4A7C15));
        var half_bits: u6 = 1;
        while ((@as(u128, 1) << (2 * @as(u7, half_bits))) < n) half_bits += 1;
        var x = index;
        while (true) {
            x = feistel(x, half_bits, key);
            if (x < n) return x;
        }
    }

    fn feistel(x: u64, half_bits: u6, key: u64) u64 {
        const mask = (@as(u64, 1) << half_bits) - 1;
        var left = (x >> half_bits) & mask;
        var right = x & mask;
        inline for (0..6) |round| {
            const f = mix64(right ^ key ^ (@as(u64, round) *% 0xD6E8FEB86659FD93)) & mask;
            const next = left ^ f;
            left = right;
            right = next;
        }
        return (left << half_bits) | right;
    }
};

/// SplitMix64's finalizer: a fast, well-mixing 64-bit permutation.
fn mix64(v: u64) u64 {
    var z = v +% 0x9E3779B97F4A7C15;
    z = (z ^ (z >> 30)) *% 0xBF58476D1CE4E5B9;
    z = (z ^ (z >> 27)) *% 0x94D049BB133111EB;
    return z ^ (z >> 31);
}

test "permutation passes visit every row exactly once" {
    const gpa = std.testing.allocator;
    const sizes = [_]u64{ 1, 2, 3, 5, 7, 16, 17, 100, 1000, 4097 };
    for (sizes) |n| {
        const seen = try gpa.alloc(bool, n);
        defer gpa.free(seen);
        for ([_]u64{ 0, 42, std.math.maxInt(u64) }) |seed| {
            for (0..3) |pass| {
                @memset(seen, false);
                for (0..n) |i| {
                    const row = Permutation.at(n, seed, pass * n + i);
                    try std.testing.expect(row < n);
                    try std.testing.expect(!seen[row]);
                    seen[row] = true;
                }
            }
        }
    }
}

test "permutation passes and seeds differ" {
    var same_pass: usize = 0;
    var same_seed: usize = 0;
    for (0..1000) |i| {
        if (Permutation.at(1000, 7, i) == Permutation.at(1000, 7, 1000 + i)) same_pass += 1;
        if (Permutation.at(1000, 7, i) == Permutation.at(1000, 8, i)) same_seed += 1;
    }
    // A random pair of permutations agrees in about one place.
    try std.testing.expect(same_pass < 20);
    try std.testing.expect(same_seed < 20);
}

test "permutation golden values (part of the determinism contract)" {
    const small = [_]u64{ 6, 2, 0, 5, 8, 4, 1, 9, 7, 3, 0, 9 };
    for (small, 0..) |want, p| try std.testing.expectEqual(want, Permutation.at(10, 0, p));
    const large = [_]u64{ 167849952, 971736402, 653524650, 124854448, 58139721, 50135879 };
    for (large, 0..) |want, p| try std.testing.expectEqual(want, Permutation.at(1_000_000_007, 42, p));
}

test {
    _ = @import("../codec/chacha.zig");
}

fn expectUniform(seed: u64, n: u64, want: []const u64) !void {
    for (want, 0..) |w, d| try testing.expectEqual(w, uniformDraw(seed, d, n));
}

fn expectWeighted(weights: []const f64, seed: u64, want: []const usize) !void {
    var table = try WeightedTable.init(testing.allocator, weights);
    defer table.deinit(testing.allocator);
    for (want, 0..) |w, d| try testing.expectEqual(w, table.draw(seed, d));
}

test "drawSeed" {
    try testing.expectEqual(@as(u64, 42), drawSeed(42, 0));
    try testing.expectEqual(@as(u64, 4294967338), drawSeed(42, 1));
    try testing.expectEqual(@as(u64, 0xFFFF_FFFF ^ 7), drawSeed(7, 0xFFFF_FFFF_0000_0000));
    try testing.expectEqual(@as(u64, 0x0000_0003_0000_0001), drawSeed(0, 0x0000_0001_0000_0003));
}

test "uniform reference sequences (reference 3.4)" {
    try expectUniform(42, 5, &.{ 3, 2, 2, 2, 0, 0, 2, 4, 1, 0, 4, 4, 0, 0, 0, 4, 2, 4, 4, 3 });
    try expectUniform(0, 5, &.{ 3, 2, 1, 1, 0, 1, 2, 3, 1, 3, 0, 4, 4, 1, 4, 0, 2, 1, 1, 1 });
    try expectUniform(1, 5, &.{ 2, 2, 3, 2, 4, 3, 3, 0, 2, 0, 1, 0, 2, 3, 1, 2, 2, 0, 2, 2 });
    try expectUniform(7, 5, &.{ 3, 0, 4, 3, 4, 1, 3, 0, 0, 1, 1, 0, 1, 1, 1, 0, 4, 0, 3, 4 });
    try expectUniform(std.math.maxInt(u64), 5, &.{ 3, 1, 0, 3, 3, 4, 0, 0, 1, 2 });
    // Two caches, paths [B(4), A(3)]: flat index over the physical concatenation.
    try expectUniform(42, 7, &.{ 4, 3, 2, 3, 1, 0, 3, 3, 1, 0, 1, 6 });
}

test "uniform: iterator windows only split the stream (reference 3.4)" {
    // E=3, four iterators: [3,2,2] [2,0,0] [2,4,1] [0,4,4]
    const want = [4][3]u64{ .{ 3, 2, 2 }, .{ 2, 0, 0 }, .{ 2, 4, 1 }, .{ 0, 4, 4 } };
    var d: u64 = 0;
    for (want) |window| {
        for (window) |w| {
            try testing.expectEqual(w, uniformDraw(42, d, 5));
            d += 1;
        }
    }
}

test "uniform: n = 1 and the largest n" {
    for (0..100) |d| try testing.expectEqual(@as(u64, 0), uniformDraw(3, d, 1));
    // n = 2^64-1: zone is n-1, almost nothing is rejected; the result is the high half.
    for (0..100) |d| try testing.expect(uniformDraw(3, d, std.math.maxInt(u64)) < std.math.maxInt(u64));
}

test "weighted reference sequences (reference 3.4)" {
    const all_one_seq = [_]usize{ 3, 2, 2, 2, 0, 0, 2, 2, 0, 0, 0, 4, 1, 3, 0, 4, 1, 4, 4, 3 };
    // After update_metadata(get_metadata()): weighted, all 1.0 (differs from uniform at draw 7).
    try expectWeighted(&.{ 1, 1, 1, 1, 1 }, 42, &all_one_seq);
    // All 2.0: same sequence.
    try expectWeighted(&.{ 2, 2, 2, 2, 2 }, 42, &all_one_seq);
    // from_config of an un-updated dataset: weighted.
    try expectWeighted(&.{ 1, 1, 1, 1, 1 }, 42, all_one_seq[0..10]);
    try expectWeighted(&.{ 1, 2, 3, 4, 5 }, 42, &.{ 4, 3, 3, 3, 1, 1, 3, 3, 1, 0, 1, 4, 2, 4, 1, 4, 2, 4, 4, 4 });
    try expectWeighted(&.{ 100, 1, 1, 1, 1 }, 42, &(.{0} ** 20));
    // Active rows = samples [4, 1]: row indices.
    try expectWeighted(&.{ 1, 1 }, 42, &.{ 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1 });
    // Rows [0,1,2,3,4,0,0] (7 rows, weighted).
    try expectWeighted(&(.{1.0} ** 7), 42, &.{ 4, 3, 2, 3, 1, 0, 3, 3, 1, 0, 1, 6, 2, 5, 0, 5, 2, 5, 6, 5 });
    // Rows [0..4, 0] with weights [1..6].
    try expectWeighted(&.{ 1, 2, 3, 4, 5, 6 }, 42, &.{ 4, 4, 3, 4, 2, 1, 4, 4, 2, 0, 2, 5 });
}

test "weighted: row ids through a table of rows (reference 3.4)" {
    const rows = [_]u64{ 0, 1, 2, 3, 4, 0, 0 };
    var table = try WeightedTable.init(testing.allocator, &(.{1.0} ** 7));
    defer table.deinit(testing.allocator);
    const want = [_]u64{ 4, 3, 2, 3, 1, 0, 3, 3, 1, 0, 1, 0, 2, 0, 0, 0, 2, 0, 0, 0 };
    for (want, 0..) |w, d| try testing.expectEqual(w, rows[table.draw(42, d)]);

    const subset = [_]u64{ 4, 1 };
    var two = try WeightedTable.init(testing.allocator, &.{ 1, 1 });
    defer two.deinit(testing.allocator);
    const want_ids = [_]u64{ 1, 1, 4, 4, 4, 4, 1, 1, 4, 4, 4, 1, 4, 1, 4, 1, 4, 1, 1, 1 };
    for (want_ids, 0..) |w, d| try testing.expectEqual(w, subset[two.draw(42, d)]);
}

test "weighted: single row, zero weights and the scale adjustment" {
    try expectWeighted(&.{0.5}, 9, &(.{0} ** 10));
    // Zero-weight rows are never chosen, including a zero last row.
    var table = try WeightedTable.init(testing.allocator, &.{ 0, 1, 0, 0, 2, 0 });
    defer table.deinit(testing.allocator);
    for (0..2000) |d| {
        const row = table.draw(11, d);
        try testing.expect(row == 1 or row == 4);
    }
    // Normal totals need no adjustment; a subnormal total is lowered by one ulp.
    try testing.expectEqual(table.total, table.scale);
    var tiny = try WeightedTable.init(testing.allocator, &(.{std.math.floatTrueMin(f64)} ** 5));
    defer tiny.deinit(testing.allocator);
    try testing.expectEqual(@as(u64, 5), @as(u64, @bitCast(tiny.total)));
    try testing.expectEqual(@as(u64, 4), @as(u64, @bitCast(tiny.scale)));
}

test "WeightedTable.init rejects invalid weights without leaking" {
    const inf = std.math.inf(f64);
    const nan = std.math.nan(f64);
    const bad = [_][]const f64{
        &.{},
        &.{ 1, -1, 1 },
        &.{-0.5},
        &.{ 1, nan },
        &.{ nan, 1 },
        &.{ 1, inf },
        &.{ -inf, 1 },
        &.{ 0, 0, 0 },
        &.{-0.0},
        &.{ 1e308, 1e308 }, // finite weights, infinite total
        &.{ std.math.floatMax(f64), std.math.floatMax(f64), 0 },
    };
    for (bad) |weights| {
        try testing.expectError(error.InvalidWeights, WeightedTable.init(testing.allocator, weights));
    }
    // Accepted edge cases: -0.0 next to a positive weight, a zero among positives.
    var ok = try WeightedTable.init(testing.allocator, &.{ -0.0, 1, 0 });
    ok.deinit(testing.allocator);
    // Allocation failure is reported as OutOfMemory.
    var failing = std.testing.FailingAllocator.init(testing.allocator, .{ .fail_index = 0 });
    try testing.expectError(error.OutOfMemory, WeightedTable.init(failing.allocator(), &.{ 1, 2, 3 }));
}

test "WeightedTable.init is one O(n) pass: one allocation, input order, no sorting" {
    const n = 1 << 20;
    const weights = try testing.allocator.alloc(f64, n);
    defer testing.allocator.free(weights);
    // Descending and irregular, so any sorting or reordering would change the sums.
    for (weights, 0..) |*w, i| w.* = @floatFromInt((n - i) * 7 % 1000 + (i & 1));

    var counting = std.testing.FailingAllocator.init(testing.allocator, .{});
    var table = try WeightedTable.init(counting.allocator(), weights);
    defer table.deinit(counting.allocator());
    try testing.expectEqual(@as(usize, 1), counting.allocations);
    try testing.expectEqual(@as(usize, (n - 1) * @sizeOf(f64)), counting.allocated_bytes);
    try testing.expectEqual(@as(usize, n - 1), table.cumulative.len);

    var running: f64 = 0;
    for (weights[0 .. n - 1], table.cumulative) |w, c| {
        running += w;
        try testing.expectEqual(running, c);
    }
    try testing.expectEqual(running + weights[n - 1], table.total);
    // Unchanged input.
    try testing.expectEqual(@as(f64, @floatFromInt(7 * n % 1000)), weights[0]);
}

test "weighted sums are left to right in f64: absorbed weights are never drawn" {
    // 1e16 + 1.0 == 1e16, so rows 1..3 have no room in the cumulative sums.
    var table = try WeightedTable.init(testing.allocator, &.{ 1e16, 1, 1, 1, 1e16 });
    defer table.deinit(testing.allocator);
    try testing.expectEqualSlices(f64, &.{ 1e16, 1e16, 1e16, 1e16 }, table.cumulative);
    for (0..2000) |d| {
        const row = table.draw(5, d);
        try testing.expect(row == 0 or row == 4);
    }
}

test "bisectRight against a linear scan" {
    var rng = ChaCha8.seedFromU64(99);
    var buf: [300]f64 = undefined;
    for (0..200) |round| {
        const len = rng.nextU32() % buf.len;
        var acc: f64 = 0;
        // Steps of 0, 1 or 2 make runs of equal values.
        for (buf[0..len]) |*v| {
            acc += @floatFromInt(rng.nextU32() % 3);
            v.* = acc;
        }
        for (0..@as(usize, @intFromFloat(acc)) + 3) |k| {
            const offset: f64 = if (round % 2 == 0) 0.0 else 0.5;
            const x = @as(f64, @floatFromInt(k)) - 1.0 + offset;
            var want: usize = 0;
            while (want < len and buf[want] <= x) want += 1;
            try testing.expectEqual(want, bisectRight(buf[0..len], x));
        }
    }

    const sorted = [_]f64{ 0.5, 1, 1, 1, 2, 2, 3.5, 7, 7, 7, 7, 9 };
    const probes = [_]f64{ -1, 0, 0.5, 0.75, 1, 1.5, 2, 3.49, 3.5, 6.99, 7, 8, 9, 10 };
    for (0..sorted.len + 1) |len| {
        for (probes) |x| {
            var want: usize = 0;
            while (want < len and sorted[want] <= x) want += 1;
            try testing.expectEqual(want, bisectRight(sorted[0..len], x));
        }
    }
}

// Golden vectors: the full sequence of `count` draws is hashed with SHA-256 as
// little-endian u64 values (as `struct.pack("<Q", v)` in the model), and the first 20
// values and the last one are also checked directly.

const UniformGolden = struct {
    seed: u64,
    n: u64,
    count: u64,
    sha256: *const [64]u8,
    first: [20]u64,
    last: u64,
};

const WeightedGolden = struct {
    weights: []const f64,
    seed: u64,
    count: u64,
    sha256: *const [64]u8,
    first: [20]usize,
    last: usize,
};

fn fromBits(comptime bits: []const u64) [bits.len]f64 {
    var out: [bits.len]f64 = undefined;
    for (bits, &out) |b, *w| w.* = @bitCast(b);
    return out;
}

fn expectDigest(want_hex: *const [64]u8, hasher: *std.crypto.hash.sha2.Sha256) !void {
    var digest: [32]u8 = undefined;
    hasher.final(&digest);
    const got_hex = std.fmt.bytesToHex(digest, .lower);
    try testing.expectEqualStrings(want_hex, &got_hex);
}

fn hashU64(hasher: *std.crypto.hash.sha2.Sha256, value: u64) void {
    var bytes: [8]u8 = undefined;
    std.mem.writeInt(u64, &bytes, value, .little);
    hasher.update(&bytes);
}

test "golden: ChaCha8 stream of seed 12345, 100 u64 (crosses rand_chacha's 4-block refill)" {
    var rng = ChaCha8.seedFromU64(12345);
    var hasher = std.crypto.hash.sha2.Sha256.init(.{});
    for (0..100) |_| hashU64(&hasher, rng.nextU64());
    try expectDigest(golden_chacha_12345_sha, &hasher);
}

test "golden: uniform draws" {
    for (uniform_golden) |g| {
        var hasher = std.crypto.hash.sha2.Sha256.init(.{});
        var last: u64 = undefined;
        for (0..g.count) |d| {
            const v = uniformDraw(g.seed, d, g.n);
            if (d < g.first.len) try testing.expectEqual(g.first[d], v);
            hashU64(&hasher, v);
            last = v;
        }
        try testing.expectEqual(g.last, last);
        try expectDigest(g.sha256, &hasher);
    }
}

test "golden: weighted draws" {
    for (weighted_golden) |g| {
        var table = try WeightedTable.init(testing.allocator, g.weights);
        defer table.deinit(testing.allocator);
        var hasher = std.crypto.hash.sha2.Sha256.init(.{});
        var last: usize = undefined;
        for (0..g.count) |d| {
            const v = table.draw(g.seed, d);
            if (d < g.first.len) try testing.expectEqual(g.first[d], v);
            hashU64(&hasher, v);
            last = v;
        }
        try testing.expectEqual(g.last, last);
        try expectDigest(g.sha256, &hasher);
    }
}

test "golden weights are the f32-widened and f64 values they claim to be" {
    try testing.expectEqual(@as(f64, @as(f32, 0.1)), w_mixed50[0]);
    try testing.expectEqual(@as(f64, 0.1), w_mixed50[5]);
    try testing.expectEqual(@as(f64, @as(f32, 1.0 / 3.0)), w_mixed50[6]);
    try testing.expectEqual(@as(f64, @as(f32, 0.3)), w_mixed50[8]);
    try testing.expectEqual(@as(f64, 1e-300), w_mixed50[3]);
    try testing.expectEqual(std.math.floatTrueMin(f64), w_mixed50[33]);
    try testing.expectEqual(@as(f64, @as(f32, 100.0 / 3.0)), w_mixed50[41]);
    try testing.expectEqual(@as(f64, @as(f32, 1e-5)), w_absorbed[12]);
    try testing.expectEqual(@as(f64, @as(f32, 3.4e38)), w_huge[6]);
    try testing.expectEqual(@as(f64, 3e300), w_huge[9]);
}

// Golden vectors generated by /work/shared/reference/sampler_model.py (see the test
// helpers above for the hashing convention).

const golden_chacha_12345_sha = "66c905c3d994bbde2b5c533bcab2173348cedda76e9a6b9d6de9223ce30d393f";

const uniform_golden = [_]UniformGolden{
    .{ .seed = 12345, .n = 100000, .count = 2000, .sha256 = "e00b70458e7f6c9b25cc4976143c92e5ff23813a113a3206c55ccad68a03fc90", .last = 77306, .first = .{
        7370,  66919, 68335, 76846, 50579, 35497, 29506, 69637, 7193,  10310,
        48665, 25748, 87708, 53845, 82378, 37496, 7999,  57021, 80687, 38178,
    } },
    .{ .seed = 18446744073709551615, .n = 100000, .count = 2000, .sha256 = "8be57bf36c55a06b7767c8b133089eef207db81abdf17421fcea9a05675ef79e", .last = 40546, .first = .{
        68408, 95743, 33614, 73167, 69793, 35874, 38018, 3539,  98347, 50596,
        33095, 42763, 36890, 56930, 82,    68517, 62114, 55544, 98255, 86675,
    } },
    .{ .seed = 0, .n = 7, .count = 2000, .sha256 = "f09ef0f81714493eca59ba6d093b68423c3e2c188404db01931d36665d28bb17", .last = 0, .first = .{
        3, 3, 1, 2, 1, 2, 3, 3, 1, 2,
        1, 6, 6, 2, 6, 2, 3, 1, 1, 6,
    } },
    .{ .seed = 99, .n = 9223372036854788153, .count = 500, .sha256 = "b6c29506abec2403fb6611682d0223dc28a62beb6be33d2524d497c14869a9d2", .last = 2601100869655819192, .first = .{
        5904968364768695631, 490502394621574118,  5527199280229381554, 7389903925528293564,
        66442680264244725,   829626435161182823,  481106397137312967,  2769002711996344645,
        7838064869824573402, 5539779788682327543, 1427921877959922287, 8911177519561685274,
        6358174905039189865, 3986864749314327997, 8773220161331421754, 1124318749817227725,
        3168095588361093249, 4690708990050074908, 8234162448517549417, 4045737540617138931,
    } },
    .{ .seed = 5, .n = 3, .count = 1000, .sha256 = "77169f5933db59afe69931bb878504fefd36a68971465e8bfb885775e9a4f8d2", .last = 0, .first = .{
        0, 2, 0, 2, 1, 1, 0, 1, 0, 0,
        0, 2, 2, 2, 0, 2, 2, 2, 1, 2,
    } },
};

/// 50 rows: f32-widened 0.1/0.3/(1/3)/random, f64 0.1, integers, zeros, 1e-300, 5e-324, 60.0
const w_mixed50 = fromBits(&.{
    0x3fb99999a0000000, 0x4002cdbaa0000000, 0x0000000000000000, 0x01a56e1fc2f8f359, // 0.10000000149011612, 2.3504536151885986, 0.0, 1e-300
    0x4014000000000000, 0x3fb999999999999a, 0x3fd5555560000000, 0x3fe3382872a5c7be, // 5.0, 0.1, 0.3333333432674408, 0.6006052245340852
    0x3fd3333340000000, 0x4004000000000000, 0x3fb99999a0000000, 0x400cf0cac0000000, // 0.30000001192092896, 2.5, 0.10000000149011612, 3.6175742149353027
    0x0000000000000000, 0x404e000000000000, 0x4014000000000000, 0x3fb999999999999a, // 0.0, 60.0, 5.0, 0.1
    0x3fd5555560000000, 0x3ff997b8c1789372, 0x3fd3333340000000, 0x4004000000000000, // 0.3333333432674408, 1.5995414311848575, 0.30000001192092896, 2.5
    0x3fb99999a0000000, 0x4009722760000000, 0x0000000000000000, 0x01a56e1fc2f8f359, // 0.10000000149011612, 3.180739164352417, 0.0, 1e-300
    0x4020000000000000, 0x3fb999999999999a, 0x3fd5555560000000, 0x3ff10011e87ec790, // 8.0, 0.1, 0.3333333432674408, 1.0625170785756133
    0x3fd3333340000000, 0x4004000000000000, 0x3fb99999a0000000, 0x400517da20000000, // 0.30000001192092896, 2.5, 0.10000000149011612, 2.6366465091705322
    0x0000000000000000, 0x0000000000000001, 0x4010000000000000, 0x3fb999999999999a, // 0.0, 5e-324, 4.0, 0.1
    0x3fd5555560000000, 0x3fedb6fd6a86a6c3, 0x3fd3333340000000, 0x4004000000000000, // 0.3333333432674408, 0.9285876350961292, 0.30000001192092896, 2.5
    0x3fb99999a0000000, 0x4040aaaaa0000000, 0x0000000000000000, 0x0000000000000001, // 0.10000000149011612, 33.33333206176758, 0.0, 5e-324
    0x4022000000000000, 0x3fb999999999999a, 0x3fd5555560000000, 0x3fccac91231af3e0, // 9.0, 0.1, 0.3333333432674408, 0.22401632513165648
    0x3fd3333340000000, 0x4004000000000000, // 0.30000001192092896, 2.5
});

/// 1e16 followed by 1.0s that left-to-right f64 sums absorb, f32-widened 1e-5 and ~1e15 values, 5e-324
const w_absorbed = fromBits(&.{
    0x4341c37937e08000, 0x3ff0000000000000, 0x3ff0000000000000, 0x3ff0000000000000, // 1e+16, 1.0, 1.0, 1.0
    0x3ff0000000000000, 0x3ff0000000000000, 0x3ff0000000000000, 0x3ff0000000000000, // 1.0, 1.0, 1.0, 1.0
    0x3ff0000000000000, 0x3ff0000000000000, 0x3ff0000000000000, 0x432550f7dca70000, // 1.0, 1.0, 1.0, 3000000000000000.0
    0x3ee4f8b580000000, 0x401c000000000000, 0x0000000000000001, 0x3ff0000000000000, // 9.999999747378752e-06, 7.0, 5e-324, 1.0
    0x4331c37937e08000, 0x4306024fe0000000, 0x4308a50240000000, 0x430396c100000000, // 5000000000000000.0, 774373946425344.0, 867103565414400.0, 689222528794624.0
    0x4304aea060000000, 0x430a47dd40000000, 0x4307a1fdc0000000, 0x43028bb640000000, // 727687920353280.0, 924670622695424.0, 831504460546048.0, 652520556855296.0
    0x42fe37eb20000000, 0x4308a79c40000000, 0x430bd4a040000000, // 531608268439552.0, 867461121441792.0, 979201138098176.0
});

/// weights up to 3e300 next to 5e-324, 1e-300, 1.0, f32-widened 3.4e38 and 0
const w_huge = fromBits(&.{
    0x7e37e43c8800759c, 0x0000000000000001, 0x7e47e43c8800759c, 0x01a56e1fc2f8f359, // 1e+300, 5e-324, 2e+300, 1e-300
    0x7e27e43c8800759c, 0x3ff0000000000000, 0x47eff933c0000000, 0x7e30b95d9266b8ba, // 5e+299, 1.0, 3.3999999521443642e+38, 7e+299
    0x0000000000000000, 0x7e51eb2d66005835, // 0.0, 3e+300
});

/// five 5e-324 weights: subnormal total, the scale loop lowers scale by one ulp
const w_subnormal = fromBits(&.{
    0x0000000000000001, 0x0000000000000001, 0x0000000000000001, 0x0000000000000001, // 5e-324, 5e-324, 5e-324, 5e-324
    0x0000000000000001, // 5e-324
});

/// total 1.7e308, close to the largest finite f64
const w_near_max = fromBits(&.{
    0x7fe1ccf385ebc8a0, 0x7fd8ebbb5516e5ad, 0x0000000000000000, // 1e+308, 7e+307, 0.0
});

const weighted_golden = [_]WeightedGolden{
    .{ .weights = &w_mixed50, .seed = 12345, .count = 3000, .sha256 = "212de060f648ca3ee98aeb897d59ce2bb07338e0d85ef9e91ef052b3d82d71f6", .last = 13, .first = .{
        11, 34, 36, 4,  14, 13, 13, 39, 10, 14,
        14, 13, 41, 19, 41, 13, 29, 41, 41, 13,
    } },
    .{ .weights = &w_mixed50, .seed = 0, .count = 3000, .sha256 = "aa63a5bb1273073e5b98c3132c893ac741d8214c04320ff5e6666b340f8d8ca6", .last = 41, .first = .{
        41, 21, 13, 13, 13, 13, 14, 41, 13, 13,
        13, 41, 41, 13, 41, 13, 13, 13, 13, 44,
    } },
    .{ .weights = &w_mixed50, .seed = 18446744073709551615, .count = 3000, .sha256 = "0ed77ff074f78ef056242144a7d3392c00dc814ca063021f12224c5e1c1bbec0", .last = 41, .first = .{
        36, 44, 13, 41, 39, 13, 13, 4,  48, 44,
        13, 13, 13, 13, 1,  37, 28, 14, 48, 4,
    } },
    .{ .weights = &w_absorbed, .seed = 12345, .count = 3000, .sha256 = "bd5731e578eb506ae93e0fdb6939d187a1fcde8e77aa2372fa78d63cfbfbd566", .last = 0, .first = .{
        0,  16, 16, 0,  16, 0,  0,  16, 0,  16,
        11, 0,  22, 16, 21, 11, 16, 18, 20, 0,
    } },
    .{ .weights = &w_absorbed, .seed = 18446744073709551615, .count = 3000, .sha256 = "718b70b50cab16a6e085fd3a91d7a3cd9c4e53fc26e06f953973eff7d30aac27", .last = 23, .first = .{
        16, 25, 0, 18, 17, 0,  0,  0,  26, 26,
        0,  11, 0, 0,  0,  16, 16, 11, 26, 0,
    } },
    .{ .weights = &w_huge, .seed = 42, .count = 1000, .sha256 = "7ee4460931317cd681469e18f4205eeb6a267af79f64e0a68fe629d9b2a223a4", .last = 0, .first = .{
        9, 7, 2, 7, 2, 0, 7, 7, 2, 0,
        2, 9, 2, 9, 0, 9, 2, 9, 9, 9,
    } },
    .{ .weights = &w_huge, .seed = 18446744073709551615, .count = 1000, .sha256 = "005494f442ef77ada8929f335df0a359910e6004eecf0480208ff5722e8fd860", .last = 4, .first = .{
        9, 9, 2, 9, 9, 2, 2, 0, 9, 9,
        2, 4, 2, 2, 0, 9, 9, 7, 9, 0,
    } },
    .{ .weights = &w_subnormal, .seed = 42, .count = 500, .sha256 = "0c346f3314ba5fba4bf86b2f4f03a5ac6e8ad77fcd000921c6cec1bd2416a665", .last = 1, .first = .{
        3, 2, 2, 2, 1, 0, 2, 2, 1, 0,
        1, 4, 2, 3, 0, 3, 1, 3, 4, 3,
    } },
    .{ .weights = &w_near_max, .seed = 42, .count = 500, .sha256 = "0350590a2226ffdc5a5569c9ba893d2eb913eaf35f7769e6d83dcb8acd453291", .last = 0, .first = .{
        1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 1, 0, 1, 0, 1, 0, 1, 1, 1,
    } },
};
