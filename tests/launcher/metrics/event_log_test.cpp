// torchelastic's events for --event-log-handler: the line Event.serialize() writes, and where
// it goes.
#include "metrics/event_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "ddp/error.h"

namespace ddprun {
namespace {

const EventContext kContext{"job7", "default", "train-0.train.ns.svc", "c10d", "/usr/bin/python3"};

TEST(EventLog, AnAgentEventIsTorchelasticsJsonLine) {
  EventFields f;
  f.state = "RENDEZVOUS";
  f.group_rank = 1;
  f.group_world_size = 2;
  f.total_run_time = 3;
  f.duration_ms = 1250;
  EXPECT_EQ(serialize_event(kContext, f),
            R"({"name": "torchelastic.worker.status.RENDEZVOUS", "source": "AGENT", )"
            R"("timestamp": 0, "metadata": {"run_id": "job7", "global_rank": null, )"
            R"("group_rank": 1, "worker_id": null, "role": "default", )"
            R"("hostname": "train-0.train.ns.svc", "state": "RENDEZVOUS", "total_run_time": 3, )"
            R"("rdzv_backend": "c10d", "raw_error": null, "metadata": )"
            R"("{\"group_world_size\": 2, \"entry_point\": \"/usr/bin/python3\"}", )"
            R"("agent_restarts": 0, "duration_ms": 1250}})");
}

TEST(EventLog, AWorkerEventCarriesItsRanksAsOneTuples) {
  EventFields f;
  f.state = "FAILED";
  f.worker = true;
  f.global_rank = 3;
  f.group_rank = 1;
  f.worker_id = "4242";
  f.group_world_size = 2;
  f.local_rank = 1;
  f.role_rank = 3;
  f.role_world_size = 4;
  f.exit_code = 1;
  f.worker_pid = 4242;
  f.raw_error = "{\"message\": \"boom\u00e9\"}";
  f.agent_restarts = 2;
  const std::string line = serialize_event(kContext, f);
  EXPECT_NE(line.find(R"("source": "WORKER")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("global_rank": 3, "group_rank": 1, "worker_id": "4242")"),
            std::string::npos)
      << line;
  // Non-ASCII escaped, as json.dumps does by default.
  EXPECT_NE(line.find(R"("raw_error": "{\"message\": \"boom\u00e9\"}")"), std::string::npos)
      << line;
  EXPECT_NE(line.find(R"(\"local_rank\": [1], \"role_rank\": [3], \"role_world_size\": [4], )"
                      R"(\"exit_code\": [1], \"worker_pid\": [4242]}")"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find(R"("agent_restarts": 2, "duration_ms": null}})"), std::string::npos) << line;
}

TEST(EventLog, AFileHandlerAppendsOneLinePerEvent) {
  const std::string path = "/tmp/ddprun-events-" + std::to_string(::getpid()) + ".jsonl";
  ::unlink(path.c_str());
  {
    EventLog log({EventLogHandler::Kind::kFile, path}, kContext);
    EventFields f;
    f.state = "SUCCEEDED";
    log.record(f);
    log.record(f);
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EventFields f;
  f.state = "SUCCEEDED";
  EXPECT_EQ(text.str(), serialize_event(kContext, f) + "\n" + serialize_event(kContext, f) + "\n");
  ::unlink(path.c_str());
  EXPECT_THROW(EventLog({EventLogHandler::Kind::kFile, "/nonexistent/dir/e.jsonl"}, kContext),
               ddp::ConfigError);
}

}  // namespace
}  // namespace ddprun
