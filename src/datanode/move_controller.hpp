// The controller of an online move (docs/moves.md, "Cancel, failure,
// crash"): the coordinator's session that carries the move out (a direct
// move_shard_online/isolate call, or a job's runner). Its connections to
// the source and to the destination live for the whole move, and the
// nodes stop the move's stream by themselves as soon as they are gone:
//
// - at the source, that connection holds the session advisory lock
//   (kControllerLockClass, hashtext(slot)) from before the slot exists;
//   the slot's decoder (move_decoder.cpp) checks, before it sends a change
//   and at most every kControllerCheckMs, that someone still holds it, and
//   ends the stream with an error otherwise (a new stream of the slot ends
//   the same way at its first change);
// - at the destination, that connection watches the move's subscription
//   (_move_watch): when the session ends while the subscription still has
//   an apply worker, the worker is stopped, and with it whatever it had
//   received but not applied yet.
//
// A crash, kill -9 or immediate stop of the coordinator closes both
// connections at once (a session running a statement there notices within
// client_connection_check_interval, 1 s). Every legitimate phase keeps its
// connection: the copy, the catch-up, the cutover and the clean-up run on
// them; an undo or a finish from fresh connections (after a failure, or
// by _move_recover) drops the stream anyway.
#pragma once

namespace sharding::move {

// 'shac': the class of the controller lock (key: hashtext of the move's name).
constexpr int kControllerLockClass = 1936220515;
// How often at most a decoder checks that the controller is there.
constexpr int kControllerCheckMs = 100;

}  // namespace sharding::move
