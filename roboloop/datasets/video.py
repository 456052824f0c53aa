# PyAV types time_base/duration as Optional and streams as unions; the checks below hold at runtime.
# mypy: disable-error-code="union-attr,operator,arg-type,assignment,return"
"""Video helpers on PyAV: probe, encode, stream-copy concatenation, frame decoding.

Concatenation never re-encodes: packets are copied and their timestamps shifted by the
running duration of the files before them, as ffmpeg's concat demuxer does. A frame at
time t of episode e therefore sits at `from_timestamp[e] + t` in the output file and
decodes to exactly the same pixels as in the source.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

logging.getLogger("libav").setLevel(logging.ERROR)


@dataclass(frozen=True)
class VideoProbe:
    codec: str
    width: int
    height: int
    fps: float
    num_frames: int
    duration_s: float
    pix_fmt: str | None  # from `scan`: None where the parameter sets (extradata) imply it
    profile: str | None = None
    extradata_sha1: str = ""  # the encoder's parameter sets (h264/HEVC SPS+PPS, AV1 sequence header)

    @property
    def encoding(self) -> tuple:
        """What must be equal for two files to be joined by stream copy (no re-encode)."""
        return self.codec, self.width, self.height, self.pix_fmt, self.profile, self.extradata_sha1

    def describe_encoding(self) -> str:
        pix_fmt = f" {self.pix_fmt}" if self.pix_fmt else ""
        return (f"{self.codec} {self.profile or ''} {self.width}x{self.height}{pix_fmt}, parameter sets "
                f"{self.extradata_sha1[:8] or 'none'}")


def probe(path: str | Path) -> VideoProbe:
    """Header-level facts about the first video stream (the codec's stream-info probe decodes a frame or two)."""
    with av.open(str(path)) as container:
        return _probe(container, path)


def _probe(container: av.container.InputContainer, path: str | Path) -> VideoProbe:
    if not container.streams.video:
        raise ValueError(f"{path}: no video stream")
    st = container.streams.video[0]
    return VideoProbe(
        codec=st.codec_context.name,
        width=st.codec_context.width,
        height=st.codec_context.height,
        fps=float(st.base_rate or st.average_rate or 0),
        num_frames=int(st.frames),
        duration_s=duration_s(container),
        pix_fmt=st.codec_context.pix_fmt,
        profile=st.codec_context.profile,
        extradata_sha1=_sha1(bytes(st.codec_context.extradata or b"")),
    )


def _sha1(data: bytes) -> str:
    import hashlib

    return hashlib.sha1(data, usedforsecurity=False).hexdigest() if data else ""


def duration_s(container: av.container.InputContainer) -> float:
    """Duration as LeRobot measures it (stream duration, else container duration)."""
    st = container.streams.video[0]
    if st.duration is not None:
        return float(st.duration * st.time_base)
    return float(container.duration / av.time_base)


# Opening a file for its packets: FFmpeg's stream-info probe then reads no packet and decodes no frame (an mp4's
# header has what a stream copy and the checks need); 1.6 ms instead of ~7 ms per 480x640 h264 file. The codec
# context's pix_fmt stays unknown: the parameter sets (extradata) imply it.
DEMUX_ONLY = {"skip_frame": "all", "probesize": "32", "analyzeduration": "0"}


def open_for_packets(path: str | Path) -> av.container.InputContainer:
    """`av.open` without FFmpeg's decoding probe; a container whose header lacks the video's size or rate is
    opened again with the full probe."""
    container = av.open(str(path), options=DEMUX_ONLY)
    st = container.streams.video[0] if container.streams.video else None
    if st is None or not (st.codec_context.width and st.codec_context.height and (st.base_rate or st.average_rate)):
        container.close()
        container = av.open(str(path))
    return container


@dataclass(frozen=True)
class PacketIndex:
    """What one demux pass over a file's first video stream found, without decoding."""

    count: int  # packets present (the demuxer's end-of-stream flush packet not counted)
    corrupt: int  # packets flagged corrupt, plus one if the demuxer failed part way
    times: tuple[float, ...]  # presentation times (s) of the packets, sorted
    keyframe_times: tuple[float, ...]  # those of keyframes (where decoding can start), sorted


def packet_index(path: str | Path) -> PacketIndex:
    """One demux pass, remembered for this file as it is (path, inode, size, mtime): the converter's output
    check and the validator it runs before it both need the packets, and demuxing a large file twice cost
    about a tenth of a conversion. A file changed since is demuxed again."""
    return scan(path)[1]


def scan(path: str | Path) -> tuple[VideoProbe, PacketIndex]:
    """`probe` and `packet_index` from one open of the file (an open costs more than demuxing 300 packets)."""
    st = os.stat(path)
    return _scan(str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=64)
def _scan(path: str, *_stat: int) -> tuple[VideoProbe, PacketIndex]:
    n = corrupt = 0
    times: list[float] = []
    keys: list[float] = []
    first_key = None
    with open_for_packets(path) as container:
        pr = _probe(container, path)
        st = container.streams.video[0]
        tb = float(st.time_base)  # a float product per packet: Fraction arithmetic costs more than the demux
        try:
            for packet in container.demux(st):
                if packet.dts is None and packet.size == 0:
                    continue  # the demuxer's end-of-stream flush packet
                n += 1
                corrupt += bool(packet.is_corrupt)
                if packet.pts is not None:
                    times.append(packet.pts * tb)
                    if packet.is_keyframe:
                        keys.append(times[-1])
                        if first_key is None:
                            first_key = packet
        except av.error.FFmpegError:
            corrupt += 1
        if pr.pix_fmt is None and not pr.extradata_sha1 and first_key is not None:
            # no parameter sets in the header to tell the encodings apart: the first frame's pixel format
            pr = dataclasses.replace(pr, pix_fmt=_decoded_format(st, first_key))
    return pr, PacketIndex(n, corrupt, tuple(sorted(times)), tuple(sorted(keys)))


def _decoded_format(st: av.video.stream.VideoStream, packet: av.Packet) -> str | None:
    try:
        st.codec_context.skip_frame = "DEFAULT"
        frames = st.codec_context.decode(packet) + st.codec_context.decode(None)
    except av.error.FFmpegError:
        return None
    return frames[0].format.name if frames else None


def count_decodable_frames(path: str | Path) -> int:
    """Decode every frame: catches truncated or corrupt payloads that headers hide."""
    with av.open(str(path)) as container:
        st = container.streams.video[0]
        st.thread_type = "AUTO"
        return sum(1 for _ in container.decode(st))


def encode_frames(
    frames: Iterable[np.ndarray],
    path: str | Path,
    fps: float,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    gop: int | None = None,
    crf: int = 23,
) -> None:
    """Encode HxWx3 uint8 frames to an mp4. `codec`: libx264 (h264) or libsvtav1 (AV1)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.mp4")
    options = {"crf": str(crf)}
    if codec == "libx264":
        # No B-frames: timestamps start at zero, as in LeRobot's recordings.
        options.update({"bf": "0", "preset": "veryfast", "tune": "zerolatency"})
        if gop:
            options["g"] = str(gop)
    elif codec == "libsvtav1":
        options.update({"preset": "12", "g": str(gop or 2)})
    with av.open(str(tmp), "w") as out:
        stream = out.add_stream(codec, rate=Fraction(str(fps)), options=options)  # 29.97 -> 2997/100 exactly
        stream.pix_fmt = pix_fmt
        first = True
        for arr in frames:
            if first:
                stream.height, stream.width = arr.shape[:2]
                first = False
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    tmp.replace(path)


def concat_videos(inputs: Sequence[str | Path], output: str | Path) -> list[tuple[float, float]]:
    """Stream-copy `inputs` into `output`; return each input's (from, to) time in the output.

    The output is written to a temporary name and renamed, so it is never seen half-written.
    All inputs must share codec parameters (same encoder settings): that is checked.
    """
    if not inputs:
        raise ValueError("concat_videos needs at least one input")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}.mp4")
    spans: list[tuple[float, float]] = []
    ref_params: tuple | None = None
    offset_s = Fraction(0)  # where the next file's packets start (container durations, like ffmpeg)
    meta_s = 0.0  # where LeRobot's metadata says it starts (sum of stream durations)
    try:
        with av.open(str(tmp), "w", options={"movflags": "faststart"}) as out:
            out_stream = None
            for src in inputs:
                with open_for_packets(src) as container:
                    st = container.streams.video[0]
                    cc = st.codec_context  # (pix_fmt unknown: the parameter sets imply it; validation compared it)
                    params = (cc.name, cc.width, cc.height, cc.profile, bytes(cc.extradata or b""))
                    if ref_params is None:
                        ref_params = params
                        out_stream = out.add_stream_from_template(st, opaque=True)
                        out_stream.time_base = st.time_base
                    elif params != ref_params:
                        what = "codec parameters" if params[:4] != ref_params[:4] else \
                            "encoder settings (its h264/HEVC parameter sets: profile, B-frames, ...)"
                        raise ValueError(
                            f"{src}: {what} differ from {inputs[0]}'s ({params[:4]} vs {ref_params[:4]}); "
                            "episodes of a camera are joined without re-encoding, which needs the same settings: "
                            "re-encode this episode like the others"
                        )
                    tb = st.time_base
                    start = container.start_time or 0  # in AV_TIME_BASE units
                    delta = int(round((offset_s - Fraction(start, av.time_base)) / tb))
                    for packet in container.demux(st):
                        if packet.dts is None:
                            continue
                        packet.pts = None if packet.pts is None else packet.pts + delta
                        packet.dts = packet.dts + delta
                        packet.stream = out_stream
                        out.mux(packet)
                    dur = duration_s(container)
                    # Advance by the container's duration (what ffmpeg's concat demuxer uses).
                    cdur = Fraction(container.duration, av.time_base) if container.duration else Fraction(dur)
                    spans.append((meta_s, meta_s + dur))
                    meta_s += dur
                    offset_s += cdur
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    return spans


def check_decodes_at(path: str | Path, timestamps_s: Sequence[float], tolerance_s: float) -> None:
    """Decode one frame at each timestamp, each from the keyframe just before it (no long pre-roll): the
    cheap proof that a file's frames exist where its metadata says. Raises ValueError naming the first missing
    one. `tolerance_s` is also the seek margin (half a frame is right)."""
    with av.open(str(path)) as container:
        st = container.streams.video[0]
        tb = float(st.time_base)
        for t in timestamps_s:
            # a margin below t: the demuxer seeks on dts, rounded; landing one frame late would miss t
            container.seek(max(0, int((t - 3 * tolerance_s) / tb)), stream=st, backward=True)
            for frame in container.decode(st):
                ft = float(frame.pts * st.time_base)
                if ft >= t - tolerance_s:
                    if abs(ft - t) > tolerance_s:
                        raise ValueError(f"{path}: no frame at t={t:.6f}s (nearest {ft:.6f}s)")
                    break
            else:
                raise ValueError(f"{path}: no frame at t={t:.6f}s (the video ends earlier)")


def decode_frames_at(path: str | Path, timestamps_s: Sequence[float], tolerance_s: float = 1e-4) -> np.ndarray:
    """Decode the frames shown at `timestamps_s` (sorted or not) as (N, H, W, 3) uint8."""
    order = np.argsort(timestamps_s)
    wanted = [float(timestamps_s[i]) for i in order]
    found: list[np.ndarray] = []
    with av.open(str(path)) as container:
        st = container.streams.video[0]
        container.seek(int(max(0.0, wanted[0] - 1.0) / st.time_base), stream=st, backward=True)
        it = iter(wanted)
        target = next(it, None)
        for frame in container.decode(st):
            if target is None:
                break
            t = float(frame.pts * st.time_base)
            while target is not None and t >= target - tolerance_s:
                if abs(t - target) > tolerance_s:
                    raise ValueError(f"{path}: no frame at t={target:.6f}s (nearest {t:.6f}s)")
                found.append(frame.to_ndarray(format="rgb24"))
                target = next(it, None)
        if target is not None:
            raise ValueError(f"{path}: no frame at t={target:.6f}s (video ends earlier)")
    out = np.empty((len(found), *found[0].shape), dtype=np.uint8)
    for dst, src in zip(order, found, strict=True):
        out[dst] = src
    return out
