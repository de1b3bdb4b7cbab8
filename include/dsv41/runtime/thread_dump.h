// Dumps the state of every thread of this process into a file descriptor: for each thread its id,
// name, kernel scheduling state and wait channel (from /proc/self/task/<tid>/{comm,stat,wchan}),
// then its call stack. Stacks of other threads are taken by sending each one a real-time signal
// (kThreadDumpSignal) whose handler calls backtrace()/backtrace_symbols_fd() onto the same fd,
// one thread at a time. Frames show "binary(symbol+off) [addr]"; function names appear only for
// exported symbols (link the binary with -rdynamic / ENABLE_EXPORTS), otherwise resolve the
// addresses with `addr2line -e dsv41-serve -f -C <offset>`.
// A thread that blocks the signal or sits in an uninterruptible wait gets a "no answer" line
// instead of a stack after `per_thread_timeout`.
#pragma once
#include <chrono>
#include <string>

namespace dsv41::runtime {

// SIGRTMIN + 5 (glibc keeps the first real-time signals for itself; these are above them).
int thread_dump_signal();

// Installs the signal handler (idempotent). Returns false (and the dump then lists threads
// without stacks) when another handler already owns the signal.
bool install_thread_dump_handler();

// Writes the dump; returns the number of threads listed. Serialised process-wide.
int write_thread_dump(int fd, std::chrono::milliseconds per_thread_timeout = std::chrono::milliseconds(500));

}  // namespace dsv41::runtime
