// Test-only server for the OpenAI JS SDK client test: the real API/HTTP/scheduler stack on the
// rule test double (tests/serve/test_model.h) with scripted answers, so that a tool-call round
// trip happens deterministically. Prints "PORT <n>" once listening; exits on SIGTERM/SIGINT.
#include <csignal>
#include <cstdio>
#include <pthread.h>

#include "serve_fixture.h"

int main() {
  using namespace dsv41;
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  sched::SchedulerOptions so;
  so.max_model_len = 8192;
  so.max_num_batched_tokens = 8192;
  serve::ApiOptions ao;
  ao.model_names = {"tiny-scripted"};
  ao.api_key = "js-test-key";
  test_support::ServedRuleModel s(so, ao, true);
  // First match wins: the tool result ("18 degrees") must be checked before the question.
  s.script("18 degrees", "The tool answered.</think>It is 18 degrees in Paris.");
  s.script("weather",
           "The user wants the weather; call the tool.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
           "name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ "
           "invoke>\n</｜DSML｜ calls>");
  s.script("Say hello", "A greeting is asked for.</think>Hello from dsv41-serve!");
  std::printf("PORT %d\n", s.http->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  return 0;
}
