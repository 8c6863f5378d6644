#pragma once
// Graceful stop on SIGTERM (Kubernetes pod eviction, spot interruption) and SIGINT: the first
// signal only sets a flag that the trainer checks after each step; the handler then restores the
// default action, so a second signal ends the process at once.
namespace ddp::train {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();
// True once SIGTERM or SIGINT arrived after install_stop_signal_handlers().
bool stop_requested();
// The signal that asked to stop, or 0.
int stop_signal_number();

}  // namespace ddp::train
