#include "ddp/train/stop_signal.h"

#include <csignal>

namespace ddp::train {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int signal) {
  g_signal = signal;
  std::signal(signal, SIG_DFL);  // async-signal-safe; a second signal is not caught
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal_number() { return g_signal; }

}  // namespace ddp::train
