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
        try lk.batch.reset(gpa, ds.fields);
        for (cache_ids, sample_ids, lk.jsons.items, lk.spans.items) |cid, sid, j, p| {
            const loc = try ds.locFor(cid, sid);
            const json = lk.raw.items[@intCast(j[0])..][0..@intCast(j[1])];
            const payload = lk.raw.items[@intCast(p[0])..][0..@intCast(p[1])];
            try lk.batch.add(ds, loc, json, payload);
        }
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
