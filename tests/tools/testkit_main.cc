// echelon_testkit: the tools the system tests drive, in one binary (one link):
//   hostile-actor   an authenticated attacker (hostile_actor.cc)
//   fuzz-replay     the fuzz targets over their corpora, as ordinary tests (fuzz_replay.cc)
//   fuzz-seed       writes the submit target's valid seed
//   load-actors     N synthetic actors against one learner (load_actors.cc)
//   parquet-dump    a Parquet file's rows as JSON lines, as the reader reads them (parquet_dump.cc)
#include <cstring>
#include <iostream>

namespace echelon::testkit {
int HostileActorMain(int argc, char** argv);
int FuzzReplayMain(int argc, char** argv);
int FuzzSeedMain(int argc, char** argv);
int LoadActorsMain(int argc, char** argv);
int ParquetDumpMain(int argc, char** argv);
}  // namespace echelon::testkit

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "hostile-actor") == 0) return echelon::testkit::HostileActorMain(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "fuzz-replay") == 0) return echelon::testkit::FuzzReplayMain(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "fuzz-seed") == 0) return echelon::testkit::FuzzSeedMain(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "load-actors") == 0) return echelon::testkit::LoadActorsMain(argc - 1, argv + 1);
  if (argc >= 2 && std::strcmp(argv[1], "parquet-dump") == 0) return echelon::testkit::ParquetDumpMain(argc - 1, argv + 1);
  std::cerr << "usage: echelon_testkit hostile-actor|fuzz-replay|fuzz-seed|load-actors|parquet-dump ..." << std::endl;
  return 2;
}
