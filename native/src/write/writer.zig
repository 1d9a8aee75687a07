//! Cache writer: fills a staging directory (store/publish.zig) with shards (records
//! appended, rotating at `max_shard_bytes` like the reference) and `index.bin`, hashing
//! every file with SHA-256 as it is written, then writes `manifest.json` last and
//! publishes the directory atomically (never replacing an existing cache unless asked).
//!
//! Invariants:
//! - Nothing appears at `<base>/<name>` until `finish` succeeds; a writer closed without
//!   finishing removes its staging directory (held under its lock until then).
//! - The bytes written depend only on the input samples and options.

const std = @import("std");
const schema = @import("../format/schema.zig");
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const lz4 = @import("../codec/lz4.zig");
const metadata_json = @import("../format/metadata_json.zig");
const arrow_write = @import("../format/arrow_write.zig");
const runtime_mod = @import("../base/runtime.zig");
const Runtime = runtime_mod.Runtime;
const publish = @import("../store/publish.zig");
const seal = @import("seal.zig");

/// renameat2 flags: fail with EEXIST instead of replacing the destination; swap the two.
pub const Options = struct {
    max_shard_bytes: u64,
    prefetch_size: u64,
    compression: manifest.Compression,
    ratio: f64,
    profile: bool = false,
    /// Stored in the manifest (this project's extension key).
    fingerprint: ?[]const u8 = null,
    /// Publish by atomically exchanging with an existing cache at the destination (which
    /// is then removed) instead of refusing it: rebuilding a stale cache.
    replace: bool = false,
    /// Uncompressed appends whose payloads average at least this many bytes are written
    /// from the caller's buffers (tests move it to force either path).
    direct_payload_bytes: u64 = direct_payload_bytes,
    /// Keep the appended metadata columns and write `metadata.arrow` at `finish`
    /// (`DRT_WRITER_METADATA`); otherwise the caller writes it and `finish` checks it.
    write_metadata: bool = false,
};

/// One metadata column kept for `metadata.arrow` (see `arrow_write.Column`): a bitmap,
/// little-endian values, or string bytes with i32 offsets.
const KeptColumn = struct {
    values: std.ArrayList(u8) = .empty,
    offsets: std.ArrayList(u8) = .empty,
};

fn freeKept(gpa: std.mem.Allocator, kept: []KeptColumn) void {
    for (kept) |*k| {
        k.values.deinit(gpa);
        k.offsets.deinit(gpa);
    }
    gpa.free(kept);
}

/// Timed stages (DRT_STAGE_* order).
pub const Stage = enum(u8) {
    record_encode,
    compression,
    disk_write,
    shard_flush,
    finish_index,
    finish_metadata,
    finish_manifest,
    publish,
};

/// One stage's totals.
pub const StageStats = struct {
    calls: u64 = 0,
    total_ns: u64 = 0,
    bytes: u64 = 0,
};

/// Stage timings, recorded only when profiling (a clock read costs tens of ns).
const Profile = struct {
    enabled: bool,
    stages: [std.meta.fields(Stage).len]StageStats = [_]StageStats{.{}} ** std.meta.fields(Stage).len,

    fn start(p: *const Profile) i128 {
        return if (p.enabled) std.time.nanoTimestamp() else 0;
    }

    fn stop(p: *Profile, stage: Stage, started: i128, bytes: u64) void {
        p.stopMany(stage, started, bytes, 1);
    }

    /// `stop` for `calls` items timed together.
    fn stopMany(p: *Profile, stage: Stage, started: i128, bytes: u64, calls: u64) void {
        if (!p.enabled) return;
        const s = &p.stages[@intFromEnum(stage)];
        s.calls += calls;
        s.total_ns += @intCast(@max(0, std.time.nanoTimestamp() - started));
        s.bytes += bytes;
    }
};

/// One column of an append batch (see drt_column).
pub const Column = struct {
    kind: schema.Kind,
    values: ?*const anyopaque,
    offsets: ?[*]const u64,
};

/// Samples handed to one encode job at least (smaller batches are not split).
const chunk_samples_min = 64;

/// Uncompressed batches whose payloads average this many bytes or more are written
/// directly from the caller's buffers (`appendDirect`) instead of through chunks.
pub const direct_payload_bytes = 64 << 10;

/// A slice of an appended batch, copied out of the caller's buffers, encoded (record
/// framing, JSON, LZ4) on a pool worker and then committed in sequence order.
const Chunk = struct {
    job: runtime_mod.Job = .{ .run = runEncode },
    w: *Writer = undefined,
    seq: u64 = 0,
    state: State = .free,
    count: usize = 0,
    /// Input: payload bytes with count + 1 offsets, field values (strings in `strings`).
    payload: std.ArrayList(u8) = .empty,
    offsets: std.ArrayList(u64) = .empty,
    values: std.ArrayList(schema.Value) = .empty,
    strings: std.ArrayList(u8) = .empty,
    /// Output: whole records back to back, their lengths and raw payload lengths.
    records: std.ArrayList(u8) = .empty,
    record_lens: std.ArrayList(u64) = .empty,
    raw_lens: std.ArrayList(u64) = .empty,
    /// LZ4's hash table, kept for every record of the chunk: a compressor made per call
    /// (`lz4.compressPrepended`) has its 16 KiB table filled in safe builds, which took
    /// longer than compressing a 512-byte record.
    compressor: lz4.Compressor = .{},
    encode_error: ?status.Error = null,
    profile: Profile = .{ .enabled = false },

    const State = enum { free, queued, encoded };

    fn deinit(c: *Chunk, gpa: std.mem.Allocator) void {
        inline for (.{ "payload", "offsets", "values", "strings", "records", "record_lens", "raw_lens" }) |name| {
            @field(c, name).deinit(gpa);
        }
    }

    fn runEncode(job: *runtime_mod.Job) void {
        const c: *Chunk = @fieldParentPtr("job", job);
        const w = c.w;
        c.encode(w) catch |err| {
            c.encode_error = err; // only OutOfMemory can happen here
        };
        w.chunkEncoded(c);
    }

    /// Encodes every sample of the chunk into `records`. Pure: touches only the chunk.
    fn encode(c: *Chunk, w: *const Writer) error{OutOfMemory}!void {
        const gpa = w.gpa;
        const nf = w.fields.len;
        c.records.clearRetainingCapacity();
        c.record_lens.clearRetainingCapacity();
        c.raw_lens.clearRetainingCapacity();
        for (0..c.count) |i| {
            const payload = c.payload.items[@intCast(c.offsets.items[i])..@intCast(c.offsets.items[i + 1])];
            const start = c.records.items.len;
            var t = c.profile.start();
            try c.records.appendNTimes(gpa, 0, 8);
            try metadata_json.encodeRecord(gpa, &c.records, w.fields, c.values.items[i * nf ..][0..nf]);
            const json_len = c.records.items.len - start - 8;
            std.mem.writeInt(u64, c.records.items[start..][0..8], json_len, .little);
            c.profile.stop(.record_encode, t, json_len + 8);
            t = c.profile.start();
            switch (w.options.compression) {
                // The compression stage of `none` is the payload's copy (as 0.4.8, which
                // reports the stage whatever the algorithm).
                .none => {
                    try c.records.appendSlice(gpa, payload);
                    c.profile.stop(.compression, t, payload.len);
                },
                .lz4 => {
                    // Straight into the records' spare room (past the result the compressor
                    // may leave scratch bytes, which the next record overwrites).
                    try c.records.ensureUnusedCapacity(gpa, lz4.prependedBound(payload.len));
                    c.records.items.len += c.compressor.compressPrepended(payload, c.records.unusedCapacitySlice());
                    c.profile.stop(.compression, t, payload.len);
                },
            }
            try c.record_lens.append(gpa, c.records.items.len - start);
            try c.raw_lens.append(gpa, payload.len);
        }
    }
};

pub const Writer = struct {
    gpa: std.mem.Allocator,
    runtime: *Runtime,
    options: Options,
    /// The staging directory this writer fills and publishes.
    staging: publish.Staging,
    name: []u8,
    fields: []schema.Field = &.{},
    schema_set: bool = false,
    field_names: std.ArrayList(u8) = .empty,
    /// With `write_metadata`: one per field, every appended row (`kept_rows` of them).
    kept: []KeptColumn = &.{},
    kept_rows: u64 = 0,

    /// Shard output: written here in order, hashed, fsynced and closed in the background.
    sealer: *seal.Sealer,
    shard_open: bool = false,
    shard_uncompressed: u64 = 0,
    shards: std.ArrayList(manifest.WriteShard) = .empty,
    index_file: publish.HashedFile,
    index_open: bool = true,
    sample_count: u64 = 0,

    /// The encode/commit pipeline. `chunks` is a ring indexed by sequence number; chunks
    /// are committed strictly in sequence order by whichever thread finds the next one
    /// encoded (`committing` makes that one thread at a time), so the bytes written do not
    /// depend on the worker count. At most prefetch_size samples plus one batch are queued.
    chunks: []Chunk = &.{},
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    next_submit: u64 = 0,
    next_commit: u64 = 0,
    committing: bool = false,
    in_flight_samples: u64 = 0,
    /// Whether a caller that would wait encodes a queued chunk itself (`encodeQueued`):
    /// when the pool has fewer workers than this process has CPUs, so that the caller's
    /// CPU is otherwise idle; with a worker on every CPU it would only take turns with them.
    caller_encodes: bool = false,
    /// Chunks the caller encoded so far (tests check that it happened).
    caller_encoded: u64 = 0,
    /// First failure of a commit (an I/O error), raised by the next append or finish.
    async_failure: ?status.Error = null,
    async_message: [status.message_bytes_max]u8 = undefined,
    async_message_len: usize = 0,
    shard_path: std.ArrayList(u8) = .empty,
    /// `appendDirect`'s buffers: the batch's checked values, one record's header.
    direct_values: std.ArrayList(schema.Value) = .empty,
    direct_header: std.ArrayList(u8) = .empty,
    failed: bool = false,
    profile: Profile,

    pub fn open(gpa: std.mem.Allocator, rt: *Runtime, base: []const u8, name: []const u8, options: Options) status.Error!*Writer {
        try rt.checkPid();
        try publish.checkName(name);
        if (options.fingerprint) |fp| {
            if (!std.unicode.utf8ValidateSlice(fp)) return status.fail(error.InvalidArgument, "CacheSource.fingerprint must be valid UTF-8", .{});
        }
        try publish.checkBase(base);
        if (options.max_shard_bytes == 0) return status.fail(error.InvalidArgument, "max_shard_bytes must be greater than zero", .{});
        if (options.prefetch_size == 0) return status.fail(error.InvalidArgument, "prefetch_size must be greater than zero", .{});
        if (!(std.math.isFinite(options.ratio) and options.ratio > 0)) return status.fail(error.InvalidArgument, "shard_compression.ratio must be positive and finite", .{});
        if (options.compression == .none and options.ratio != 1.0) return status.fail(error.InvalidArgument, "shard_compression.ratio must be 1.0 when algo is 'none'", .{});

        const name_copy = try gpa.dupe(u8, name);
        errdefer gpa.free(name_copy);
        var staging = try publish.Staging.create(gpa, base, name, options.replace);
        errdefer staging.discard(gpa);
        const index_file = staging.dir.createFile("index.bin", .{}) catch |err| return status.failIo(err, staging.staging_path);
        errdefer index_file.close();

        const chunk_count = @max(2, 2 * rt.num_workers);
        const chunks = try gpa.alloc(Chunk, chunk_count);
        errdefer gpa.free(chunks);
        @memset(chunks, .{});

        const fingerprint: ?[]u8 = if (options.fingerprint) |fp| try gpa.dupe(u8, fp) else null;
        errdefer if (fingerprint) |fp| gpa.free(fp);
        // Shards hashed at once: one per worker (at most 8: the pool has other work, and
        // each slot holds a read buffer), plus the one being written and one more.
        const sealer = try seal.Sealer.init(gpa, &rt.pool, @min(rt.num_workers, 8) + 2, options.profile);
        errdefer sealer.deinit(false);

        const w = try gpa.create(Writer);
        for (chunks) |*c| {
            c.w = w;
            c.profile.enabled = options.profile;
        }
        w.* = .{
            .chunks = chunks,
            .caller_encodes = rt.num_workers < (std.Thread.getCpuCount() catch 1),
            .gpa = gpa,
            .runtime = rt.retain(),
            .options = options,
            .staging = staging,
            .sealer = sealer,
            .name = name_copy,
            .index_file = .{ .file = index_file, .hasher = .init() },
            .profile = .{ .enabled = options.profile },
        };
        w.options.fingerprint = fingerprint;
        return w;
    }

    pub fn setSchema(w: *Writer, fields: []const schema.Field) status.Error!void {
        if (w.schema_set) return status.fail(error.InvalidArgument, "the writer's schema is already set", .{});
        if (!schema.isSorted(fields)) return status.fail(error.InvalidArgument, "schema fields must be sorted by name without duplicates", .{});
        var total: usize = 0;
        for (fields) |f| {
            if (!std.unicode.utf8ValidateSlice(f.name)) return status.fail(error.InvalidArgument, "metadata keys must be valid UTF-8", .{});
            for ([_][]const u8{ "cache_id", "sample_id", "weight" }) |reserved| {
                if (std.mem.eql(u8, f.name, reserved)) return status.fail(error.InvalidArgument, "metadata field '{s}' is reserved", .{reserved});
            }
            total += f.name.len;
        }
        // Built aside and installed at the end: a failure (out of memory) leaves the
        // writer without a schema, as before the call.
        const gpa = w.gpa;
        var names: std.ArrayList(u8) = .empty;
        errdefer names.deinit(gpa);
        try names.ensureTotalCapacity(gpa, total);
        const copy = try gpa.alloc(schema.Field, fields.len);
        errdefer gpa.free(copy);
        const kept = try gpa.alloc(KeptColumn, if (w.options.write_metadata) fields.len else 0);
        @memset(kept, .{});
        errdefer freeKept(gpa, kept);
        for (kept, 0..) |*k, i| {
            if (fields[i].kind == .string) try k.offsets.appendNTimes(gpa, 0, 4);
        }
        for (fields, copy) |f, *c| {
            const start = names.items.len;
            names.appendSliceAssumeCapacity(f.name);
            c.* = .{ .name = names.items[start..], .kind = f.kind };
        }
        w.field_names = names;
        w.fields = copy;
        w.kept = kept;
        w.schema_set = true;
    }

    /// Appends `count` samples (see drt_writer_append): validates them and copies them
    /// into chunks that the pool encodes while the caller produces the next batch. Blocks
    /// while prefetch_size samples are still queued (one more batch may wait). After an error the
    /// writer is poisoned: only close is allowed.
    pub fn append(w: *Writer, count: u64, payloads: [*]const u8, offsets: [*]const u64, columns: [*]const Column) status.Error!void {
        try w.runtime.checkPid();
        if (w.failed or w.staging.published) return status.fail(error.InvalidArgument, "the writer cannot accept samples after a failure or finish", .{});
        if (!w.schema_set) return status.fail(error.InvalidArgument, "drt_writer_set_schema must be called before appending", .{});
        errdefer w.failed = true;
        try w.checkAsync();
        for (w.fields, 0..) |f, c| {
            if (columns[c].kind != f.kind) return status.fail(error.InvalidArgument, "column {d} has the wrong kind", .{c});
            if (columns[c].values == null and count > 0) return status.fail(error.InvalidArgument, "column {d} has no values", .{c});
            if (f.kind == .string and columns[c].offsets == null) return status.fail(error.InvalidArgument, "string column {d} has no offsets", .{c});
        }
        const n: usize = @intCast(count);
        for (0..n) |i| {
            if (offsets[i + 1] < offsets[i]) return status.fail(error.InvalidArgument, "payload offsets must not decrease", .{});
            if (w.options.compression == .lz4 and offsets[i + 1] - offsets[i] > std.math.maxInt(u32)) {
                return status.fail(error.InvalidArgument, "lz4 payloads must be smaller than 4 GiB", .{});
            }
        }
        if (w.options.compression == .none and n > 0 and offsets[n] - offsets[0] >= w.options.direct_payload_bytes *| n) {
            try w.appendDirect(n, payloads, offsets, columns);
        } else {
            const parts = @min(w.runtime.num_workers, @max(1, n / chunk_samples_min));
            var start: usize = 0;
            for (0..parts) |p| {
                const end = if (p + 1 == parts) n else start + n / parts;
                const chunk = try w.acquireChunk(end - start);
                w.fillChunk(chunk, start, end, payloads, offsets, columns) catch |err| {
                    w.releaseUnsubmitted(chunk);
                    return err;
                };
                w.runtime.pool.submit(&chunk.job);
                start = end;
            }
        }
        if (w.options.write_metadata) try w.keepColumns(n, columns);
    }

    /// Adds the `n` samples just appended to the kept columns (their values were checked:
    /// bools 0 or 1, string offsets not decreasing).
    fn keepColumns(w: *Writer, n: usize, columns: [*]const Column) status.Error!void {
        if (n == 0) return;
        const gpa = w.gpa;
        const first_row = w.kept_rows;
        for (w.fields, w.kept, 0..) |f, *k, col| {
            const column = columns[col];
            switch (f.kind) {
                .bool => {
                    const bits = first_row + n;
                    try k.values.appendNTimes(gpa, 0, @intCast((bits + 7) / 8 - k.values.items.len));
                    for (@as([*]const u8, @ptrCast(column.values.?))[0..n], 0..) |b, i| {
                        const row = first_row + i;
                        k.values.items[@intCast(row / 8)] |= @as(u8, b) << @intCast(row % 8);
                    }
                },
                // Native order is little-endian on every target the library supports.
                .int, .float => try k.values.appendSlice(gpa, @as([*]const u8, @ptrCast(column.values.?))[0 .. 8 * n]),
                .string => {
                    const offs = column.offsets.?;
                    const base = k.values.items.len;
                    const lo: usize = @intCast(offs[0]);
                    const hi: usize = @intCast(offs[n]);
                    if (hi - lo > std.math.maxInt(i32) - base) {
                        return status.fail(error.InvalidArgument, "metadata field '{s}' holds more than 2 GiB of strings", .{f.name});
                    }
                    try k.values.appendSlice(gpa, @as([*]const u8, @ptrCast(column.values.?))[lo..hi]);
                    try k.offsets.ensureUnusedCapacity(gpa, 4 * n);
                    for (offs[1 .. n + 1]) |o| {
                        var le: [4]u8 = undefined;
                        std.mem.writeInt(i32, &le, @intCast(base + (@as(usize, @intCast(o)) - lo)), .little);
                        k.offsets.appendSliceAssumeCapacity(&le);
                    }
                },
            }
        }
        w.kept_rows += n;
    }

    /// Large uncompressed payloads: once every queued chunk is committed, each record is
    /// encoded and written on the calling thread, its payload straight from the caller's
    /// buffer into the shard (hashed as it is written, never copied). The bytes are the
    /// ones the chunk path writes.
    fn appendDirect(w: *Writer, n: usize, payloads: [*]const u8, offsets: [*]const u64, columns: [*]const Column) status.Error!void {
        const gpa = w.gpa;
        const nf = w.fields.len;
        w.drain();
        try w.checkAsync();
        // The same checks as the chunk path, before anything is written.
        try w.direct_values.resize(gpa, n * nf);
        for (0..n) |i| {
            for (w.fields, 0..) |f, col| w.direct_values.items[i * nf + col] = try columnValue(f, columns[col], i);
        }
        for (0..n) |i| {
            const payload = payloads[@intCast(offsets[i])..@intCast(offsets[i + 1])];
            var t = w.profile.start();
            w.direct_header.clearRetainingCapacity();
            try w.direct_header.appendNTimes(gpa, 0, 8);
            try metadata_json.encodeRecord(gpa, &w.direct_header, w.fields, w.direct_values.items[i * nf ..][0..nf]);
            const json_len = w.direct_header.items.len - 8;
            std.mem.writeInt(u64, w.direct_header.items[0..8], json_len, .little);
            w.profile.stop(.record_encode, t, json_len + 8);
            // Uncompressed and not copied: the compression stage passes it through.
            w.profile.stop(.compression, w.profile.start(), payload.len);
            const record_len = w.direct_header.items.len + payload.len;
            // Sequence order is kept: nothing else is in flight (drained above), and
            // the caller appends from one thread.
            if (w.shard_open) {
                const written = w.sealer.written();
                if (written > 0 and written + record_len > w.options.max_shard_bytes) try w.closeShard();
            }
            if (!w.shard_open) try w.openShard();
            t = w.profile.start();
            const offset = w.sealer.written();
            try w.sealer.append(w.direct_header.items);
            try w.sealer.append(payload);
            w.shard_uncompressed += payload.len;
            const row = index.encode(.{ .shard_id = w.shards.items.len, .offset = offset, .byte_len = record_len });
            try w.index_file.append(gpa, &row, w.staging.staging_path);
            w.sample_count += 1;
            w.profile.stop(.disk_write, t, record_len + index.row_bytes);
        }
    }

    /// Waits for a free chunk and room under the in-flight bound, then reserves both.
    fn acquireChunk(w: *Writer, samples: usize) status.Error!*Chunk {
        w.mutex.lock();
        defer w.mutex.unlock();
        // One batch may queue while up to max(prefetch_size, batch) samples are still
        // being encoded or committed, so the caller produces the next batch while the
        // pool works (a whole batch of the caller's may be in flight).
        const bound = @max(w.options.prefetch_size, samples) +| samples;
        while (true) {
            if (w.async_failure != null) break;
            const chunk = &w.chunks[@intCast(w.next_submit % w.chunks.len)];
            if (chunk.state == .free and w.in_flight_samples + samples <= bound) break;
            if (!w.encodeQueued()) w.cond.wait(&w.mutex);
        }
        if (w.async_failure) |err| return status.failText(err, w.async_message[0..w.async_message_len]);
        const chunk = &w.chunks[@intCast(w.next_submit % w.chunks.len)];
        chunk.seq = w.next_submit;
        chunk.state = .queued;
        chunk.count = samples;
        chunk.encode_error = null;
        w.next_submit += 1;
        w.in_flight_samples += samples;
        return chunk;
    }

    /// A chunk reserved but not submitted (its input failed validation): its slot is
    /// skipped by the commit sequence (the writer is poisoned anyway).
    fn releaseUnsubmitted(w: *Writer, chunk: *Chunk) void {
        chunk.encode_error = error.InvalidArgument;
        w.chunkEncoded(chunk);
    }

    /// Copies samples [start, end) into the chunk, validating values as it goes: payloads
    /// and offsets, then one column at a time (its kind switched on once, its string bytes
    /// copied and UTF-8-checked in one piece). When a column holds an invalid value,
    /// `firstInvalid` reports the first one in sample order, then field order, as a
    /// sample-by-sample check would.
    fn fillChunk(w: *Writer, c: *Chunk, start: usize, end: usize, payloads: [*]const u8, offsets: [*]const u64, columns: [*]const Column) status.Error!void {
        const gpa = w.gpa;
        const nf = w.fields.len;
        const first: usize = @intCast(offsets[start]);
        const last: usize = @intCast(offsets[end]);
        c.payload.clearRetainingCapacity();
        try c.payload.appendSlice(gpa, payloads[first..last]);
        c.offsets.clearRetainingCapacity();
        try c.offsets.ensureTotalCapacity(gpa, end - start + 1);
        for (offsets[start .. end + 1]) |offset| c.offsets.appendAssumeCapacity(offset - offsets[start]);
        // Reserve the string bytes first so slices into `strings` never move.
        var string_bytes: usize = 0;
        for (w.fields, 0..) |f, col| {
            if (f.kind != .string) continue;
            const offs = columns[col].offsets.?;
            if (offs[end] < offs[start]) return status.fail(error.InvalidArgument, "string offsets must not decrease", .{});
            string_bytes += @intCast(offs[end] - offs[start]);
        }
        c.strings.clearRetainingCapacity();
        try c.strings.ensureTotalCapacity(gpa, string_bytes);
        c.values.clearRetainingCapacity();
        try c.values.resize(gpa, (end - start) * nf);
        for (w.fields, 0..) |f, col| {
            if (!fillColumn(f.kind, columns[col], start, end, c.values.items, col, nf, &c.strings)) {
                return firstInvalid(w.fields, columns, start, end);
            }
        }
    }

    /// Converts samples [start, end) of one column into `out[k * stride + col]` (k counts
    /// from 0), string values as slices of their bytes appended to `strings` (capacity
    /// reserved by the caller). False when a value is invalid (an out-of-range bool, a
    /// non-finite float, decreasing string offsets or a string that is not UTF-8).
    ///
    /// A string column is UTF-8-checked as one piece: its bytes are valid and every value
    /// starts on a character boundary exactly when every value is valid on its own.
    fn fillColumn(kind: schema.Kind, column: Column, start: usize, end: usize, out: []schema.Value, col: usize, stride: usize, strings: *std.ArrayList(u8)) bool {
        const n = end - start;
        switch (kind) {
            .bool => {
                const src = @as([*]const u8, @ptrCast(column.values.?))[start..end];
                var valid = true;
                for (src, 0..) |b, k| {
                    valid = valid and b <= 1;
                    out[k * stride + col] = .{ .bool = b == 1 };
                }
                return valid;
            },
            .int => {
                const src = @as([*]const i64, @ptrCast(@alignCast(column.values.?)))[start..end];
                for (src, 0..) |x, k| out[k * stride + col] = .{ .int = x };
                return true;
            },
            .float => {
                const src = @as([*]const f64, @ptrCast(@alignCast(column.values.?)))[start..end];
                var valid = true;
                for (src, 0..) |x, k| {
                    valid = valid and std.math.isFinite(x);
                    out[k * stride + col] = .{ .float = x };
                }
                return valid;
            },
            .string => {
                const offs = column.offsets.?;
                const lo: usize = @intCast(offs[start]);
                const hi: usize = @intCast(offs[end]);
                const bytes = @as([*]const u8, @ptrCast(column.values.?))[lo..hi];
                if (!std.unicode.utf8ValidateSlice(bytes)) return false;
                const at = strings.items.len;
                strings.appendSliceAssumeCapacity(bytes);
                const copy = strings.items[at..][0..bytes.len];
                for (0..n) |k| {
                    const from: usize = @intCast(offs[start + k]);
                    const to: usize = @intCast(offs[start + k + 1]);
                    // (the offsets before this value did not decrease, so from >= lo)
                    if (to < from or to > hi) return false;
                    if (from < hi and (bytes[from - lo] & 0xC0) == 0x80) return false;
                    out[k * stride + col] = .{ .string = copy[from - lo .. to - lo] };
                }
                return true;
            },
        }
    }

    /// The error of the first invalid value of samples [start, end), in sample order, then
    /// field order (`fillColumn` found one).
    fn firstInvalid(fields: []const schema.Field, columns: [*]const Column, start: usize, end: usize) status.Error {
        for (start..end) |i| {
            for (fields, 0..) |f, col| _ = columnValue(f, columns[col], i) catch |err| return err;
        }
        return status.fail(error.InvalidArgument, "invalid column values", .{});
    }

    fn columnValue(field: schema.Field, column: Column, i: usize) status.Error!schema.Value {
        switch (field.kind) {
            .bool => {
                const b = @as([*]const u8, @ptrCast(column.values.?))[i];
                if (b > 1) return status.fail(error.InvalidArgument, "metadata field '{s}' has an invalid bool", .{field.name});
                return .{ .bool = b == 1 };
            },
            .int => return .{ .int = @as([*]const i64, @ptrCast(@alignCast(column.values.?)))[i] },
            .float => {
                const x = @as([*]const f64, @ptrCast(@alignCast(column.values.?)))[i];
                if (!std.math.isFinite(x)) return status.fail(error.InvalidArgument, "metadata field '{s}' must be a finite float", .{field.name});
                return .{ .float = x };
            },
            .string => {
                const offs = column.offsets.?;
                if (offs[i + 1] < offs[i]) return status.fail(error.InvalidArgument, "string offsets must not decrease", .{});
                const s = @as([*]const u8, @ptrCast(column.values.?))[@intCast(offs[i])..@intCast(offs[i + 1])];
                if (!std.unicode.utf8ValidateSlice(s)) return status.fail(error.InvalidArgument, "metadata field '{s}' is not valid UTF-8", .{field.name});
                return .{ .string = s };
            },
        }
    }

    /// Called (on a worker, or inline for a skipped chunk) when a chunk is encoded: commits
    /// it and every following encoded chunk in sequence order, unless another thread is
    /// already committing (it will pick them up).
    fn chunkEncoded(w: *Writer, done: *Chunk) void {
        w.mutex.lock();
        done.state = .encoded;
        if (w.committing) {
            w.mutex.unlock();
            return;
        }
        w.committing = true;
        while (true) {
            const c = &w.chunks[@intCast(w.next_commit % w.chunks.len)];
            if (w.next_commit == w.next_submit or c.state != .encoded) break;
            w.mutex.unlock();
            var failure: ?status.Error = null;
            if (w.async_failure == null) {
                if (c.encode_error) |err| {
                    if (err == error.OutOfMemory) failure = status.fail(error.OutOfMemory, "out of memory while encoding records", .{});
                } else {
                    w.commitChunk(c) catch |err| {
                        failure = err;
                    };
                }
            }
            w.mutex.lock();
            if (failure) |err| {
                const msg = status.lastMessage();
                const len = @min(msg.len, w.async_message.len);
                @memcpy(w.async_message[0..len], msg[0..len]);
                w.async_message_len = len;
                w.async_failure = err;
            }
            c.state = .free;
            w.in_flight_samples -= c.count;
            w.next_commit += 1;
            w.cond.broadcast();
        }
        w.committing = false;
        w.mutex.unlock();
    }

    /// Appends one encoded chunk's records to the shards and index (single-threaded).
    fn commitChunk(w: *Writer, c: *Chunk) status.Error!void {
        const gpa = w.gpa;
        for (c.profile.stages, &w.profile.stages) |from, *to| {
            to.calls += from.calls;
            to.total_ns += from.total_ns;
            to.bytes += from.bytes;
        }
        c.profile.stages = [_]StageStats{.{}} ** c.profile.stages.len;
        const lens = c.record_lens.items;
        var at: usize = 0;
        var i: usize = 0;
        while (i < lens.len) {
            if (w.shard_open) {
                const written = w.sealer.written();
                if (written > 0 and written + lens[i] > w.options.max_shard_bytes) try w.closeShard();
            }
            if (!w.shard_open) try w.openShard();
            const t = w.profile.start();
            // The run of records that go to this shard (the rotation rule above, record by
            // record) is appended in one piece: a large run is written straight from
            // `records`, without a copy into the shard buffer.
            const run_start = at;
            var offset = w.sealer.written();
            var j = i;
            while (j < lens.len) : (j += 1) {
                const record_len = lens[j];
                if (j > i and offset + record_len > w.options.max_shard_bytes) break;
                const row = index.encode(.{ .shard_id = w.shards.items.len, .offset = offset, .byte_len = record_len });
                try w.index_file.append(gpa, &row, w.staging.staging_path);
                offset += record_len;
                at += @intCast(record_len);
                w.shard_uncompressed += c.raw_lens.items[j];
            }
            try w.sealer.append(c.records.items[run_start..at]);
            w.sample_count += j - i;
            w.profile.stopMany(.disk_write, t, at - run_start + (j - i) * index.row_bytes, j - i);
            i = j;
        }
    }

    /// Raises the first commit or sealing failure, if any.
    fn checkAsync(w: *Writer) status.Error!void {
        {
            w.mutex.lock();
            defer w.mutex.unlock();
            if (w.async_failure) |err| return status.failText(err, w.async_message[0..w.async_message_len]);
        }
        try w.sealer.check();
    }

    /// Waits until every submitted chunk is committed (or skipped after a failure).
    /// Waits until every appended sample is committed (its chunk encoded and written): then
    /// `sample_count` and the stage timings count every append so far, and no worker
    /// updates them while the caller reads them.
    pub fn drain(w: *Writer) void {
        w.mutex.lock();
        defer w.mutex.unlock();
        while (w.next_commit != w.next_submit) {
            if (!w.encodeQueued()) w.cond.wait(&w.mutex);
        }
    }

    /// Under `mutex`, for a caller that would otherwise wait: encodes (and commits, as a
    /// worker would) the oldest submitted chunk no worker has started, taken back from
    /// the pool, and returns true; false when there is none (every queued chunk is
    /// running) or `caller_encodes` is off. With fewer workers than CPUs the calling
    /// thread then works instead of sleeping while the pool is behind (a W2 write of
    /// compressible text with LZ4 and one worker on two CPUs: 1.65-1.75x). The bytes
    /// written do not change: a chunk's encoding does not depend on the thread, and
    /// commits stay in sequence order.
    fn encodeQueued(w: *Writer) bool {
        if (!w.caller_encodes) return false;
        var seq = w.next_commit;
        while (seq != w.next_submit) : (seq += 1) {
            const c = &w.chunks[@intCast(seq % w.chunks.len)];
            if (c.state != .queued or !w.runtime.pool.cancel(&c.job)) continue;
            w.caller_encoded += 1;
            w.mutex.unlock();
            defer w.mutex.lock();
            Chunk.runEncode(&c.job);
            return true;
        }
        return false;
    }

    fn openShard(w: *Writer) status.Error!void {
        var name_buf: [32]u8 = undefined;
        const name = manifest.shardName(&name_buf, w.shards.items.len);
        // The shard's path, kept for error messages while it is being written.
        w.shard_path.clearRetainingCapacity();
        try w.shard_path.print(w.gpa, "{s}/shards/{s}", .{ w.staging.staging_path, name });
        var shards_dir = w.staging.dir.openDir("shards", .{}) catch |err| return status.failIo(err, w.staging.staging_path);
        defer shards_dir.close();
        try w.sealer.open(shards_dir, name, w.shard_path.items);
        w.shard_open = true;
        w.shard_uncompressed = 0;
    }

    /// Hands the shard to the sealer; its digest is filled in by `finish`.
    fn closeShard(w: *Writer) status.Error!void {
        const t = w.profile.start();
        defer w.profile.stop(.shard_flush, t, 0);
        w.shard_open = false;
        const byte_len = try w.sealer.close();
        try w.shards.append(w.gpa, .{ .uncompressed_byte_len = w.shard_uncompressed, .byte_len = byte_len, .sha256 = undefined });
    }

    /// See drt_writer_finish.
    pub fn finish(w: *Writer) status.Error!void {
        try w.runtime.checkPid();
        if (w.failed or w.staging.published) return status.fail(error.InvalidArgument, "the writer cannot finish after a failure or finish", .{});
        errdefer w.failed = true;
        w.drain();
        try w.checkAsync();
        if (w.sample_count == 0) return status.fail(error.InvalidArgument, "cache source yielded no samples", .{});
        try w.closeShard();
        // The last shards are sealed on the pool while the index and metadata.arrow are
        // hashed and fsynced here.
        var t = w.profile.start();
        const index_sha = try w.index_file.finish(w.staging.staging_path);
        w.index_open = false;
        w.profile.stop(.finish_index, t, w.index_file.written);

        t = w.profile.start();
        const metadata_sha = if (w.options.write_metadata)
            try w.writeMetadata()
        else
            try w.staging.checkMetadata(w.gpa, w.fields, w.sample_count);
        w.profile.stop(.finish_metadata, t, 0);
        t = w.profile.start();
        try w.sealer.wait();
        std.debug.assert(w.shards.items.len == w.sealer.digests.items.len);
        for (w.shards.items, w.sealer.digests.items) |*entry, digest| entry.sha256 = digest;
        w.profile.stop(.shard_flush, t, 0);
        {
            const from = w.sealer.stats;
            const to = &w.profile.stages[@intFromEnum(Stage.shard_flush)];
            to.calls += from.calls;
            to.total_ns += from.total_ns;
            to.bytes += from.bytes;
        }
        t = w.profile.start();

        var text: std.ArrayList(u8) = .empty;
        defer text.deinit(w.gpa);
        try manifest.write(w.gpa, &text, .{
            .source_name = w.name,
            .sample_count = w.sample_count,
            .fields = w.fields,
            .metadata_sha256 = metadata_sha,
            .index_sha256 = index_sha,
            .shards = w.shards.items,
            .compression = w.options.compression,
            .ratio = w.options.ratio,
            .fingerprint = w.options.fingerprint,
        });
        try w.staging.writeManifest(text.items);
        w.profile.stop(.finish_manifest, t, text.items.len);
        t = w.profile.start();
        defer w.profile.stop(.publish, t, 0);
        try w.staging.rename(w.options.replace);
    }

    /// Writes the kept columns as the staging `metadata.arrow` (replacing whatever is at
    /// that name, never through it), fsynced; returns its SHA-256.
    fn writeMetadata(w: *Writer) status.Error![32]u8 {
        const gpa = w.gpa;
        const path = try std.fmt.allocPrint(gpa, "{s}/metadata.arrow", .{w.staging.staging_path});
        defer gpa.free(path);
        const columns = try gpa.alloc(arrow_write.Column, w.fields.len);
        defer gpa.free(columns);
        for (columns, w.fields, w.kept) |*c, f, k| {
            c.* = .{ .name = f.name, .kind = f.kind, .values = k.values.items, .offsets = k.offsets.items };
        }
        // Whatever the caller left at the name goes first (a symbolic link is not followed,
        // a FIFO not opened); the new file is created exclusively.
        w.staging.dir.deleteFile("metadata.arrow") catch |err| switch (err) {
            error.FileNotFound => {},
            else => return status.failIo(err, path),
        };
        const file = w.staging.dir.createFile("metadata.arrow", .{ .exclusive = true }) catch |err| return status.failIo(err, path);
        var out: MetadataOut = .{ .gpa = gpa, .path = path, .file = .{ .file = file, .hasher = .init() } };
        var file_open = true;
        defer out.file.deinit(gpa, file_open);
        try arrow_write.write(gpa, w.sample_count, columns, &out, MetadataOut.write);
        const sha = try out.file.finish(path);
        file_open = false;
        return sha;
    }

    const MetadataOut = struct {
        gpa: std.mem.Allocator,
        path: []const u8,
        file: publish.HashedFile,

        fn write(out: *MetadataOut, bytes: []const u8) status.Error!void {
            try out.file.append(out.gpa, bytes, out.path);
        }
    };

    /// Releases everything; removes the staging directory unless the cache was published.
    pub fn close(w: *Writer) void {
        const gpa = w.gpa;
        const forked = if (w.runtime.checkPid()) |_| false else |_| true;
        if (!forked) w.drain(); // no job may touch the writer after this
        for (w.chunks) |*c| c.deinit(gpa);
        gpa.free(w.chunks);
        w.sealer.deinit(forked);
        w.index_file.deinit(gpa, w.index_open);
        w.staging.close(gpa, forked);
        w.runtime.release();
        w.shards.deinit(gpa);
        w.shard_path.deinit(gpa);
        w.direct_values.deinit(gpa);
        w.direct_header.deinit(gpa);
        w.field_names.deinit(gpa);
        freeKept(gpa, w.kept);
        gpa.free(w.fields);
        gpa.free(w.name);
        if (w.options.fingerprint) |fp| gpa.free(fp);
        gpa.destroy(w);
    }

    pub fn stagingPath(w: *const Writer) []const u8 {
        return w.staging.staging_path;
    }
};

// ---------------------------------------------------------------- tests
//
// Kept at the very end of the file: the code above is reworked separately. write/ may not
// import read/, so these tests read what they wrote with the format/ parsers only.

const testing = std.testing;
const build_options = @import("build_options");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const shard_format = @import("../format/shard.zig");
const arrow = @import("../format/arrow.zig");

/// Input of `Writer.append` for up to four fields, owned: payloads with count + 1 offsets,
/// and per field bool bytes, ints, floats, or string bytes with count + 1 offsets.
const TestInput = struct {
    fields: []const schema.Field,
    payloads: std.ArrayList(u8) = .empty,
    offsets: std.ArrayList(u64) = .empty,
    columns: [4]ColumnData = @splat(.{}),

    const ColumnData = struct {
        bytes: std.ArrayList(u8) = .empty,
        ints: std.ArrayList(i64) = .empty,
        floats: std.ArrayList(f64) = .empty,
        offsets: std.ArrayList(u64) = .empty,
    };

    fn init(gpa: std.mem.Allocator, fields: []const schema.Field) !TestInput {
        std.debug.assert(fields.len <= 4);
        var in: TestInput = .{ .fields = fields };
        errdefer in.deinit(gpa);
        try in.offsets.append(gpa, 0);
        for (&in.columns) |*c| try c.offsets.append(gpa, 0);
        return in;
    }

    fn deinit(in: *TestInput, gpa: std.mem.Allocator) void {
        in.payloads.deinit(gpa);
        in.offsets.deinit(gpa);
        for (&in.columns) |*c| {
            c.bytes.deinit(gpa);
            c.ints.deinit(gpa);
            c.floats.deinit(gpa);
            c.offsets.deinit(gpa);
        }
    }

    fn count(in: *const TestInput) u64 {
        return in.offsets.items.len - 1;
    }

    fn add(in: *TestInput, gpa: std.mem.Allocator, payload: []const u8, values: []const schema.Value) !void {
        std.debug.assert(values.len == in.fields.len);
        try in.payloads.appendSlice(gpa, payload);
        try in.offsets.append(gpa, in.payloads.items.len);
        for (in.fields, values, in.columns[0..in.fields.len]) |f, v, *c| switch (f.kind) {
            .bool => try c.bytes.append(gpa, @intFromBool(v.bool)),
            .int => try c.ints.append(gpa, v.int),
            .float => try c.floats.append(gpa, v.float),
            .string => {
                try c.bytes.appendSlice(gpa, v.string);
                try c.offsets.append(gpa, c.bytes.items.len);
            },
        };
    }

    fn columnViews(in: *const TestInput) [4]Column {
        var out: [4]Column = undefined;
        for (in.fields, in.columns[0..in.fields.len], out[0..in.fields.len]) |f, *c, *o| {
            o.* = .{ .kind = f.kind, .offsets = null, .values = switch (f.kind) {
                .bool, .string => c.bytes.items.ptr,
                .int => c.ints.items.ptr,
                .float => c.floats.items.ptr,
            } };
            if (f.kind == .string) o.offsets = c.offsets.items.ptr;
        }
        return out;
    }

    /// Appends samples [from, to) in one call.
    fn appendTo(in: *const TestInput, w: *Writer, from: usize, to: usize) status.Error!void {
        var cols = in.columnViews();
        for (in.fields, cols[0..in.fields.len], in.columns[0..in.fields.len]) |f, *col, *c| {
            // Offsets of strings (and payloads below) are absolute, so only values move.
            switch (f.kind) {
                .bool => col.values = c.bytes.items.ptr + from,
                .int => col.values = c.ints.items.ptr + from,
                .float => col.values = c.floats.items.ptr + from,
                .string => col.offsets = c.offsets.items.ptr + from,
            }
        }
        try w.append(to - from, in.payloads.items.ptr, in.offsets.items.ptr + from, &cols);
    }
};

/// A parsed copy of a fixture cache: its manifest and the writer input it holds (payloads
/// decompressed, metadata parsed from the embedded JSON), which rebuilds it.
const FixtureCache = struct {
    dir: std.fs.Dir,
    manifest: manifest.Manifest,
    input: TestInput,

    /// Fixture `name` of the reference caches.
    fn load(gpa: std.mem.Allocator, name: []const u8) !FixtureCache {
        const path = try std.fs.path.join(gpa, &.{ build_options.fixtures_dir, name });
        defer gpa.free(path);
        return loadAt(gpa, path);
    }

    /// The cache at `path`.
    fn loadAt(gpa: std.mem.Allocator, path: []const u8) !FixtureCache {
        var dir = try std.fs.cwd().openDir(path, .{});
        errdefer dir.close();
        const text = try dir.readFileAlloc(gpa, "manifest.json", 1 << 20);
        defer gpa.free(text);
        var m = try manifest.parse(gpa, text, "manifest.json");
        errdefer m.deinit();
        var input = try TestInput.init(gpa, m.fields);
        errdefer input.deinit(gpa);
        const idx = try dir.readFileAlloc(gpa, "index.bin", 1 << 24);
        defer gpa.free(idx);
        var values: [4]schema.Value = undefined;
        var scratch: std.ArrayList(u8) = .empty;
        defer scratch.deinit(gpa);
        var raw: std.ArrayList(u8) = .empty;
        defer raw.deinit(gpa);
        var shard_bytes: ?[]u8 = null;
        defer if (shard_bytes) |b| gpa.free(b);
        var shard_loaded: u64 = std.math.maxInt(u64);
        for (0..m.sample_count) |i| {
            const row = index.get(idx, i);
            if (row.shard_id != shard_loaded) {
                if (shard_bytes) |b| gpa.free(b);
                shard_bytes = null;
                const shard_path = try std.fmt.allocPrint(gpa, "shards/{s}", .{m.shards[@intCast(row.shard_id)].name});
                defer gpa.free(shard_path);
                shard_bytes = try dir.readFileAlloc(gpa, shard_path, 1 << 24);
                shard_loaded = row.shard_id;
            }
            const rec = try shard_format.split(shard_bytes.?[@intCast(row.offset)..][0..@intCast(row.byte_len)]);
            var payload = rec.stored_payload;
            if (m.shards[@intCast(row.shard_id)].compression == .lz4) {
                try raw.resize(gpa, try lz4.prependedSize(payload));
                try lz4.decompressPrepended(payload, raw.items);
                payload = raw.items;
            }
            scratch.clearRetainingCapacity();
            var diag: metadata_json.Diagnostic = .{};
            try metadata_json.parseRecord(rec.json, m.fields, values[0..m.fields.len], &scratch, gpa, &diag);
            try input.add(gpa, payload, values[0..m.fields.len]);
        }
        return .{ .dir = dir, .manifest = m, .input = input };
    }

    fn deinit(f: *FixtureCache, gpa: std.mem.Allocator) void {
        f.input.deinit(gpa);
        f.manifest.deinit();
        f.dir.close();
    }
};

/// Entries under `<base>/tmp` (staging directories left behind).
fn stagingLeft(base: std.fs.Dir) !usize {
    var tmp_dir = base.openDir("tmp", .{ .iterate = true }) catch |err| switch (err) {
        error.FileNotFound => return 0,
        else => return err,
    };
    defer tmp_dir.close();
    var it = tmp_dir.iterate();
    var n: usize = 0;
    while (try it.next()) |_| n += 1;
    return n;
}

fn exists(dir: std.fs.Dir, sub: []const u8) bool {
    dir.access(sub, .{}) catch return false;
    return true;
}

fn expectSameFile(gpa: std.mem.Allocator, a: std.fs.Dir, b: std.fs.Dir, sub: []const u8) !void {
    errdefer std.debug.print("{s} differs\n", .{sub});
    const x = try a.readFileAlloc(gpa, sub, 1 << 24);
    defer gpa.free(x);
    const y = try b.readFileAlloc(gpa, sub, 1 << 24);
    defer gpa.free(y);
    try testing.expectEqualSlices(u8, x, y);
}

/// Expects caches `a` and `b` (directories of `base`) to hold the same `index.bin` and
/// shard files, and returns how many shards they have. Their manifests name the source, so
/// only what they say about the bytes is compared (the shard count).
fn expectSameCacheBytes(gpa: std.mem.Allocator, base: std.fs.Dir, a: []const u8, b: []const u8) !usize {
    var a_dir = try base.openDir(a, .{});
    defer a_dir.close();
    var b_dir = try base.openDir(b, .{});
    defer b_dir.close();
    const a_text = try a_dir.readFileAlloc(gpa, "manifest.json", 1 << 20);
    defer gpa.free(a_text);
    var a_manifest = try manifest.parse(gpa, a_text, "manifest.json");
    defer a_manifest.deinit();
    const b_text = try b_dir.readFileAlloc(gpa, "manifest.json", 1 << 20);
    defer gpa.free(b_text);
    var b_manifest = try manifest.parse(gpa, b_text, "manifest.json");
    defer b_manifest.deinit();
    try testing.expectEqual(a_manifest.shards.len, b_manifest.shards.len);
    try expectSameFile(gpa, a_dir, b_dir, "index.bin");
    for (a_manifest.shards) |sh| {
        const sub = try std.fmt.allocPrint(gpa, "shards/{s}", .{sh.name});
        defer gpa.free(sub);
        try expectSameFile(gpa, a_dir, b_dir, sub);
    }
    return a_manifest.shards.len;
}

/// Checks `want` against row `row` of an Arrow column.
fn expectArrowValue(want: schema.Value, col: arrow.Column, row: u64) !void {
    try testing.expect(!col.isNull(row));
    switch (want) {
        .bool => |b| try testing.expectEqual(b, col.getBool(row)),
        .int => |x| try testing.expectEqual(x, col.getInt(row)),
        .float => |x| try testing.expectEqual(@as(u64, @bitCast(x)), @as(u64, @bitCast(col.getFloat(row)))),
        .string => |x| try testing.expectEqualStrings(x, col.getString(row)),
        .null => return error.TestUnexpectedResult,
    }
}

/// Two Arrow IPC files hold the same fields and the same values, row for row.
fn expectSameArrowValues(gpa: std.mem.Allocator, a_bytes: []const u8, b_bytes: []const u8) !void {
    var a = try arrow.File.parse(gpa, a_bytes);
    defer a.deinit(gpa);
    var b = try arrow.File.parse(gpa, b_bytes);
    defer b.deinit(gpa);
    try testing.expectEqual(a.row_count, b.row_count);
    try testing.expectEqual(a.fields.len, b.fields.len);
    for (a.fields, b.fields) |x, y| {
        try testing.expectEqualStrings(x.name, y.name);
        try testing.expectEqual(x.type, y.type);
    }
    for (0..a.row_count) |row| {
        const at = a.locate(row);
        const bt = b.locate(row);
        for (a.fields, a.batches[at.batch].columns, b.batches[bt.batch].columns) |f, x, y| {
            const want: schema.Value = switch (f.type) {
                .bool => .{ .bool = x.getBool(at.index) },
                .int64 => .{ .int = x.getInt(at.index) },
                .float64 => .{ .float = x.getFloat(at.index) },
                .utf8 => .{ .string = x.getString(at.index) },
                else => return error.TestUnexpectedResult,
            };
            try expectArrowValue(want, y, bt.index);
        }
    }
}

fn sha256Of(bytes: []const u8) [64]u8 {
    var digest: [32]u8 = undefined;
    Sha256.hash(bytes, &digest);
    return std.fmt.bytesToHex(digest, .lower);
}

/// Writes `input` as cache `name` under `base` in appends of at most `step` samples, with
/// `metadata` as its metadata.arrow (null: the writer's own, `options.write_metadata`),
/// and publishes it.
fn writeCache(gpa: std.mem.Allocator, rt: *Runtime, base: []const u8, name: []const u8, options: Options, input: *const TestInput, step: usize, metadata: ?[]const u8) !void {
    const w = try Writer.open(gpa, rt, base, name, options);
    defer w.close();
    try fillAndFinish(w, input, step, metadata);
}

/// `writeCache` after the writer is open: the appends, metadata.arrow and the publication.
fn fillAndFinish(w: *Writer, input: *const TestInput, step: usize, metadata: ?[]const u8) !void {
    try w.setSchema(input.fields);
    var from: usize = 0;
    while (from < input.count()) {
        const to = @min(input.count(), from + step);
        try input.appendTo(w, from, to);
        from = to;
    }
    if (metadata) |bytes| {
        var staging = try std.fs.cwd().openDir(w.stagingPath(), .{});
        defer staging.close();
        try staging.writeFile(.{ .sub_path = "metadata.arrow", .data = bytes });
    } else try testing.expect(w.options.write_metadata);
    w.finish() catch |err| {
        std.debug.print("finish: {s}\n", .{status.lastMessage()});
        return err;
    };
}

test "writer: rebuilds the reference's uncompressed caches byte for byte, whatever the append sizes" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 3);
    defer rt.release();
    // max_shard_bytes: 4096 reproduces plain_many_shards' 25 shards (the reference's
    // setting); the others are single shards.
    const cases = [_]struct { name: []const u8, max_shard_bytes: u64, step: usize }{
        .{ .name = "plain_one_shard", .max_shard_bytes = 1 << 20, .step = 1000 },
        .{ .name = "plain_many_shards", .max_shard_bytes = 4096, .step = 130 },
        .{ .name = "unicode_é_name", .max_shard_bytes = 1 << 20, .step = 1 },
        .{ .name = "text_records_v1", .max_shard_bytes = 1 << 20, .step = 2 },
    };
    for (cases) |case| {
        errdefer std.debug.print("cache {s}\n", .{case.name});
        var fixture = try FixtureCache.load(gpa, case.name);
        defer fixture.deinit(gpa);
        const metadata = try fixture.dir.readFileAlloc(gpa, "metadata.arrow", 1 << 24);
        defer gpa.free(metadata);
        try writeCache(gpa, rt, base, case.name, .{ .max_shard_bytes = case.max_shard_bytes, .prefetch_size = 64, .compression = .none, .ratio = 1.0 }, &fixture.input, case.step, metadata);
        var out = try tmp.dir.openDir(case.name, .{});
        defer out.close();
        // Same metadata.arrow, so even the manifest is the reference's, byte for byte.
        for ([_][]const u8{ "manifest.json", "index.bin", "metadata.arrow" }) |file| try expectSameFile(gpa, fixture.dir, out, file);
        for (fixture.manifest.shards) |s| {
            const sub = try std.fmt.allocPrint(gpa, "shards/{s}", .{s.name});
            defer gpa.free(sub);
            try expectSameFile(gpa, fixture.dir, out, sub);
        }
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: large payloads written from the caller's buffers give the same bytes as the chunk path" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    const fields = [_]schema.Field{ .{ .name = "label", .kind = .int }, .{ .name = "name", .kind = .string } };
    var input = try TestInput.init(gpa, &fields);
    defer input.deinit(gpa);
    var prng = std.Random.DefaultPrng.init(5);
    const payload = try gpa.alloc(u8, 200 << 10);
    defer gpa.free(payload);
    prng.random().bytes(payload);
    for (0..23) |i| {
        // 0 B to 200 KiB: some appends average above the threshold, some below.
        const len = (i * 37) % 11 * (20 << 10);
        var name_buf: [16]u8 = undefined;
        const name = try std.fmt.bufPrint(&name_buf, "s{d}", .{i});
        try input.add(gpa, payload[i..][0..len -| i], &.{ .{ .int = @intCast(i) }, .{ .string = name } });
    }
    const cases = [_]struct { name: []const u8, direct: u64, step: usize }{
        .{ .name = "chunks", .direct = std.math.maxInt(u64), .step = 23 },
        .{ .name = "direct", .direct = 0, .step = 1 },
        .{ .name = "direct_batches", .direct = 0, .step = 5 },
        .{ .name = "mixed", .direct = 64 << 10, .step = 2 },
    };
    for (cases) |case| {
        errdefer std.debug.print("case {s}\n", .{case.name});
        try writeCache(gpa, rt, base, case.name, .{ .max_shard_bytes = 300 << 10, .prefetch_size = 4, .compression = .none, .ratio = 1.0, .direct_payload_bytes = case.direct, .write_metadata = true }, &input, case.step, null);
    }
    for (cases[1..]) |case| {
        errdefer std.debug.print("case {s}\n", .{case.name});
        try testing.expect(try expectSameCacheBytes(gpa, tmp.dir, "chunks", case.name) > 3);
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: chunks the caller encodes while it would wait give the same bytes as the pool's" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 1);
    defer rt.release();
    const fields = [_]schema.Field{ .{ .name = "label", .kind = .int }, .{ .name = "name", .kind = .string } };
    var input = try TestInput.init(gpa, &fields);
    defer input.deinit(gpa);
    // Compressible records, slow enough to encode that the caller finds chunks queued.
    const text = "the quick brown fox jumps over the lazy dog, " ** 400;
    for (0..3000) |i| {
        var name_buf: [16]u8 = undefined;
        const name = try std.fmt.bufPrint(&name_buf, "s{d}", .{i % 7});
        try input.add(gpa, text[i % 97 ..][0 .. 2000 + i % 1500], &.{ .{ .int = @intCast(i) }, .{ .string = name } });
    }
    var encoded_by_caller: u64 = 0;
    for ([_]bool{ false, true }, [_][]const u8{ "pool", "caller" }) |helps, name| {
        const w = try Writer.open(gpa, rt, base, name, .{ .max_shard_bytes = 16 << 10, .prefetch_size = 64, .compression = .lz4, .ratio = 1.0, .write_metadata = true });
        defer w.close();
        w.caller_encodes = helps;
        try fillAndFinish(w, &input, 64, null);
        if (helps) encoded_by_caller = w.caller_encoded else try testing.expectEqual(@as(u64, 0), w.caller_encoded);
    }
    // One worker encodes ~64 records of 2-3.5 KiB of LZ4 per chunk while the caller only
    // copies them: the caller runs out of room and takes chunks over.
    errdefer std.debug.print("chunks encoded by the caller: {d}\n", .{encoded_by_caller});
    try testing.expect(encoded_by_caller > 0);
    try testing.expect(try expectSameCacheBytes(gpa, tmp.dir, "pool", "caller") >= 3);
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: an lz4 cache decodes to the reference's records, and its manifest agrees" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    var fixture = try FixtureCache.load(gpa, "lz4_many_shards");
    defer fixture.deinit(gpa);
    try writeCache(gpa, rt, base, "lz4_many_shards", .{ .max_shard_bytes = 8192, .prefetch_size = 16, .compression = .lz4, .ratio = 2.0, .write_metadata = true }, &fixture.input, 77, null);
    const sub = try std.fs.path.join(gpa, &.{ base, "lz4_many_shards" });
    defer gpa.free(sub);
    var out_dir = try std.fs.cwd().openDir(sub, .{});
    defer out_dir.close();
    const text = try out_dir.readFileAlloc(gpa, "manifest.json", 1 << 20);
    defer gpa.free(text);
    var m = try manifest.parse(gpa, text, "manifest.json");
    defer m.deinit();
    try testing.expectEqual(fixture.manifest.cache_id, m.cache_id);
    try testing.expectEqualStrings("lz4_many_shards", m.source_name);
    try testing.expectEqual(@as(u64, 300), m.sample_count);
    try testing.expectEqual(fixture.manifest.fields.len, m.fields.len);
    for (fixture.manifest.fields, m.fields) |a, b| {
        try testing.expectEqualStrings(a.name, b.name);
        try testing.expectEqual(a.kind, b.kind);
    }
    for (m.shards) |s| {
        try testing.expectEqual(manifest.Compression.lz4, s.compression);
        try testing.expectEqual(@as(f64, 2.0), s.ratio);
        try testing.expect(s.byte_len <= 8192);
        const shard_sub = try std.fmt.allocPrint(gpa, "shards/{s}", .{s.name});
        defer gpa.free(shard_sub);
        const bytes = try out_dir.readFileAlloc(gpa, shard_sub, 1 << 20);
        defer gpa.free(bytes);
        try testing.expectEqual(s.byte_len, bytes.len);
        try testing.expectEqualStrings(&sha256Of(bytes), s.sha256);
    }
    const idx = try out_dir.readFileAlloc(gpa, "index.bin", 1 << 20);
    defer gpa.free(idx);
    try testing.expectEqualStrings(&sha256Of(idx), m.index_sha256);
    // The writer's own metadata.arrow holds the reference's values.
    const arrow_bytes = try out_dir.readFileAlloc(gpa, "metadata.arrow", 1 << 20);
    defer gpa.free(arrow_bytes);
    try testing.expectEqualStrings(&sha256Of(arrow_bytes), m.metadata_sha256);
    const reference_arrow = try fixture.dir.readFileAlloc(gpa, "metadata.arrow", 1 << 20);
    defer gpa.free(reference_arrow);
    try expectSameArrowValues(gpa, reference_arrow, arrow_bytes);

    // Read back the way the fixture was read: the same samples, decompressed.
    var mine = try FixtureCache.loadAt(gpa, sub);
    defer mine.deinit(gpa);
    try testing.expectEqualSlices(u8, fixture.input.payloads.items, mine.input.payloads.items);
    try testing.expectEqualSlices(u64, fixture.input.offsets.items, mine.input.offsets.items);
    for (fixture.input.columns, mine.input.columns) |a, b| {
        try testing.expectEqualSlices(u8, a.bytes.items, b.bytes.items);
        try testing.expectEqualSlices(i64, a.ints.items, b.ints.items);
        try testing.expectEqualSlices(f64, a.floats.items, b.floats.items);
        try testing.expectEqualSlices(u64, a.offsets.items, b.offsets.items);
    }
}

const small_fields = [_]schema.Field{
    .{ .name = "flag", .kind = .bool },
    .{ .name = "label", .kind = .int },
    .{ .name = "name", .kind = .string },
    .{ .name = "score", .kind = .float },
};

/// Five samples with their exact records' JSON (serde_json's compact form).
const small_samples = [_]struct { payload: []const u8, values: [4]schema.Value, json: []const u8 }{
    .{ .payload = "zero", .values = .{ .{ .bool = true }, .{ .int = -3 }, .{ .string = "a\"b" }, .{ .float = 0.5 } }, .json = "{\"flag\":true,\"label\":-3,\"name\":\"a\\\"b\",\"score\":0.5}" },
    .{ .payload = "", .values = .{ .{ .bool = false }, .{ .int = 0 }, .{ .string = "é" }, .{ .float = 1.0 } }, .json = "{\"flag\":false,\"label\":0,\"name\":\"é\",\"score\":1.0}" },
    .{ .payload = "two two two two two two two two", .values = .{ .{ .bool = true }, .{ .int = 9007199254740993 }, .{ .string = "" }, .{ .float = -1e300 } }, .json = "{\"flag\":true,\"label\":9007199254740993,\"name\":\"\",\"score\":-1e+300}" },
    .{ .payload = "3", .values = .{ .{ .bool = false }, .{ .int = 3 }, .{ .string = "c" }, .{ .float = 0.1 } }, .json = "{\"flag\":false,\"label\":3,\"name\":\"c\",\"score\":0.1}" },
    .{ .payload = "four", .values = .{ .{ .bool = true }, .{ .int = 4 }, .{ .string = "d" }, .{ .float = 4.0 } }, .json = "{\"flag\":true,\"label\":4,\"name\":\"d\",\"score\":4.0}" },
};

fn smallInput(gpa: std.mem.Allocator) !TestInput {
    var in = try TestInput.init(gpa, &small_fields);
    errdefer in.deinit(gpa);
    for (small_samples) |s| try in.add(gpa, s.payload, &s.values);
    return in;
}

test "writer: the published layout: manifest fields, index rows, record bytes, shard rotation" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    var input = try smallInput(gpa);
    defer input.deinit(gpa);

    for ([_]manifest.Compression{ .none, .lz4 }) |compression| {
        const name = compression.name();
        // 100 bytes: records of ~60-100 bytes, so most shards hold one or two.
        const max_shard_bytes = 100;
        const ratio: f64 = if (compression == .lz4) 3.5 else 1.0;
        try writeCache(gpa, rt, base, name, .{ .max_shard_bytes = max_shard_bytes, .prefetch_size = 2, .compression = compression, .ratio = ratio, .fingerprint = "fp-1", .write_metadata = true }, &input, 2, null);
        var out = try tmp.dir.openDir(name, .{});
        defer out.close();
        const text = try out.readFileAlloc(gpa, "manifest.json", 1 << 20);
        defer gpa.free(text);
        var m = try manifest.parse(gpa, text, "manifest.json");
        defer m.deinit();
        try testing.expectEqual(@as(u32, 3), m.format_version);
        try testing.expectEqual(manifest.cacheIdForName(name), m.cache_id.?);
        try testing.expectEqualStrings(name, m.source_name);
        try testing.expectEqual(@as(u64, small_samples.len), m.sample_count);
        try testing.expectEqualStrings("fp-1", m.fingerprint.?);
        for (small_fields, m.fields) |a, b| {
            try testing.expectEqualStrings(a.name, b.name);
            try testing.expectEqual(a.kind, b.kind);
        }
        const arrow_bytes = try out.readFileAlloc(gpa, "metadata.arrow", 1 << 20);
        defer gpa.free(arrow_bytes);
        try testing.expectEqualStrings(&sha256Of(arrow_bytes), m.metadata_sha256);
        {
            var parsed = try arrow.File.parse(gpa, arrow_bytes);
            defer parsed.deinit(gpa);
            try testing.expectEqual(@as(u64, small_samples.len), parsed.row_count);
            for (small_samples, 0..) |sample, row| {
                const at = parsed.locate(row);
                for (sample.values, parsed.batches[at.batch].columns) |want, col| {
                    try expectArrowValue(want, col, at.index);
                }
            }
        }
        const idx = try out.readFileAlloc(gpa, "index.bin", 1 << 20);
        defer gpa.free(idx);
        try testing.expectEqual(small_samples.len * index.row_bytes, idx.len);
        try testing.expectEqualStrings(&sha256Of(idx), m.index_sha256);

        // Records back to back from offset 0 in each shard; a shard is closed before the
        // record that would take it past max_shard_bytes (unless it is still empty).
        var shard_files: [small_samples.len][]u8 = undefined;
        for (m.shards, 0..) |s, i| {
            const sub = try std.fmt.allocPrint(gpa, "shards/{s}", .{s.name});
            defer gpa.free(sub);
            shard_files[i] = try out.readFileAlloc(gpa, sub, 1 << 20);
            try testing.expectEqual(s.byte_len, shard_files[i].len);
            try testing.expectEqualStrings(&sha256Of(shard_files[i]), s.sha256);
            try testing.expectEqual(compression, s.compression);
            try testing.expectEqual(ratio, s.ratio);
        }
        defer for (shard_files[0..m.shards.len]) |f| gpa.free(f);
        var shard_id: u64 = 0;
        var offset: u64 = 0;
        var uncompressed: u64 = 0;
        for (small_samples, 0..) |sample, i| {
            const row = index.get(idx, i);
            if (row.shard_id != shard_id) {
                try testing.expectEqual(shard_id + 1, row.shard_id);
                try testing.expectEqual(offset, m.shards[@intCast(shard_id)].byte_len);
                try testing.expectEqual(uncompressed, m.shards[@intCast(shard_id)].uncompressed_byte_len);
                try testing.expect(offset + row.byte_len > max_shard_bytes);
                shard_id = row.shard_id;
                offset = 0;
                uncompressed = 0;
            }
            try testing.expectEqual(offset, row.offset);
            const image = shard_files[@intCast(row.shard_id)][@intCast(row.offset)..][0..@intCast(row.byte_len)];
            try testing.expectEqual(@as(u64, sample.json.len), std.mem.readInt(u64, image[0..8], .little));
            const rec = try shard_format.split(image);
            try testing.expectEqualStrings(sample.json, rec.json);
            switch (compression) {
                .none => try testing.expectEqualStrings(sample.payload, rec.stored_payload),
                .lz4 => {
                    var raw: [64]u8 = undefined;
                    const n = try lz4.prependedSize(rec.stored_payload);
                    try lz4.decompressPrepended(rec.stored_payload, raw[0..n]);
                    try testing.expectEqualStrings(sample.payload, raw[0..n]);
                },
            }
            offset += row.byte_len;
            uncompressed += sample.payload.len;
        }
        try testing.expectEqual(m.shards.len - 1, shard_id);
        try testing.expectEqual(offset, m.shards[m.shards.len - 1].byte_len);
        try testing.expect(m.shards.len >= 3);
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: a writer that fails or is closed unfinished leaves no staging directory and publishes nothing" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    var input = try smallInput(gpa);
    defer input.deinit(gpa);
    const options: Options = .{ .max_shard_bytes = 1 << 20, .prefetch_size = 4, .compression = .none, .ratio = 1.0 };

    {
        // No samples.
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try testing.expectEqual(@as(usize, 1), try stagingLeft(tmp.dir));
        try testing.expectError(error.InvalidArgument, w.finish());
        try testing.expectEqualStrings("cache source yielded no samples", status.lastMessage());
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
    {
        // An invalid value poisons the writer.
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try input.appendTo(w, 0, 2);
        input.columns[0].bytes.items[3] = 2;
        defer input.columns[0].bytes.items[3] = 0;
        try testing.expectError(error.InvalidArgument, input.appendTo(w, 2, 5));
        try testing.expectEqualStrings("metadata field 'flag' has an invalid bool", status.lastMessage());
        try testing.expectError(error.InvalidArgument, input.appendTo(w, 0, 1));
        try testing.expectEqualStrings("the writer cannot accept samples after a failure or finish", status.lastMessage());
        try testing.expectError(error.InvalidArgument, w.finish());
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
    {
        // Samples appended, then closed without finishing.
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try input.appendTo(w, 0, 5);
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
    {
        // finish fails: the caller never wrote metadata.arrow.
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try input.appendTo(w, 0, 5);
        try testing.expectError(error.Io, w.finish());
        // The message names the missing file, not just its directory.
        try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "/metadata.arrow"));
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
    try testing.expect(!exists(tmp.dir, "c"));
}

test "writer: a chunk reports the first invalid value in sample order and checks each string on its own" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    const options: Options = .{ .max_shard_bytes = 1 << 20, .prefetch_size = 4, .compression = .none, .ratio = 1.0 };
    {
        // Sample 3's bool and sample 1's float are invalid: the float is reported, though
        // its column comes after the bool's.
        var input = try smallInput(gpa);
        defer input.deinit(gpa);
        input.columns[0].bytes.items[3] = 2;
        input.columns[3].floats.items[1] = std.math.inf(f64);
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try input.appendTo(w, 0, 0); // an empty append is accepted (no column is touched)
        try testing.expectError(error.InvalidArgument, input.appendTo(w, 0, 5));
        try testing.expectEqualStrings("metadata field 'score' must be a finite float", status.lastMessage());
    }
    {
        // "é" split across two values: their bytes together are valid UTF-8, neither value
        // is on its own.
        var input = try TestInput.init(gpa, &small_fields);
        defer input.deinit(gpa);
        try input.add(gpa, "a", &.{ .{ .bool = true }, .{ .int = 1 }, .{ .string = "x\xc3" }, .{ .float = 1.0 } });
        try input.add(gpa, "b", &.{ .{ .bool = false }, .{ .int = 2 }, .{ .string = "\xa9" }, .{ .float = 2.0 } });
        const w = try Writer.open(gpa, rt, base, "c", options);
        defer w.close();
        try w.setSchema(&small_fields);
        try testing.expectError(error.InvalidArgument, input.appendTo(w, 0, 2));
        try testing.expectEqualStrings("metadata field 'name' is not valid UTF-8", status.lastMessage());
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: a second writer of a published name gets error.Exists" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(base);
    const rt = try Runtime.open(gpa, 2);
    defer rt.release();
    var input = try smallInput(gpa);
    defer input.deinit(gpa);
    const options: Options = .{ .max_shard_bytes = 1 << 20, .prefetch_size = 4, .compression = .none, .ratio = 1.0, .write_metadata = true };
    const dest = try std.fs.path.join(gpa, &.{ base, "c" });
    defer gpa.free(dest);
    var buf: [std.fs.max_path_bytes + 64]u8 = undefined;
    const message = try std.fmt.bufPrint(&buf, "cache path already exists: {s}", .{dest});

    // Two writers of one name race: the first to finish publishes, the other fails.
    {
        const first = try Writer.open(gpa, rt, base, "c", options);
        defer first.close();
        const second = try Writer.open(gpa, rt, base, "c", options);
        defer second.close();
        for ([_]*Writer{ first, second }, [_]usize{ 3, 5 }) |w, n| {
            try w.setSchema(&small_fields);
            try input.appendTo(w, 0, n);
        }
        try first.finish();
        try testing.expectError(error.Exists, second.finish());
        try testing.expectEqualStrings(message, status.lastMessage());
        try testing.expectEqual(@as(usize, 1), try stagingLeft(tmp.dir)); // the second's, until closed
    }
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
    // The published cache is the first writer's (three samples).
    const idx = try tmp.dir.readFileAlloc(gpa, "c/index.bin", 1 << 20);
    defer gpa.free(idx);
    try testing.expectEqual(@as(usize, 3 * index.row_bytes), idx.len);

    // Once published, opening a writer of that name fails at once, leaving nothing.
    try testing.expectError(error.Exists, Writer.open(gpa, rt, base, "c", options));
    try testing.expectEqualStrings(message, status.lastMessage());
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}

test "writer: out of memory while opening or setting the schema leaks nothing and leaves no staging" {
    var tmp = testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(testing.allocator, ".");
    defer testing.allocator.free(base);
    const rt = try Runtime.open(testing.allocator, 1);
    defer rt.release();
    try testing.checkAllAllocationFailures(testing.allocator, struct {
        fn run(gpa: std.mem.Allocator, r: *Runtime, b: []const u8) !void {
            const options: Options = .{ .max_shard_bytes = 1 << 20, .prefetch_size = 4, .compression = .none, .ratio = 1.0, .write_metadata = true };
            const w = try Writer.open(gpa, r, b, "c", options);
            defer w.close();
            try w.setSchema(&small_fields);
        }
    }.run, .{ rt, base });
    try testing.expectEqual(@as(usize, 0), try stagingLeft(tmp.dir));
}
