#pragma once
// The command-line glue the three apps (fsdp_app, fsdp_bench, fsdp_ckpt) share: CLI11 does the
// parsing and writes --help; this turns what it reports into the project's error contract, one
// line naming the problem (the caller prefixes the program's name and picks the exit status).
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace fsdp_cli {

// The settings every program here shares, applied to a fresh app before its options are added:
// a repeated option takes its last value and a flag takes no value (as the hand-written parsers
// had it), and arguments CLI11 does not recognise are left for parse() to name the way those
// parsers did ("unknown option '--x'") instead of CLI11's "The following argument was not
// expected".
void configure(CLI::App& app);

// Parses argv into the variables bound to `app`. Returns true when -h/--help was given: the
// caller prints app.help() (rank 0 only under MPI; it is the subcommand's help when the --help
// came after a subcommand) and exits 0. A bad command line throws
// fsdp::Error with one line ending in "(try --help)": CLI11's own message, or "unknown option
// '--x'", "unexpected argument 'x'"; for an app with subcommands also "no command given" and
// "unknown command 'x'", both listing the commands.
bool parse(CLI::App& app, int argc, char** argv);

// The rank the launcher gave this process, read from its environment before MPI starts:
// Open MPI's mpirun (OMPI_COMM_WORLD_RANK), a PMIx launcher (PMIX_RANK), MPICH's Hydra (PMI_RANK),
// srun (SLURM_PROCID); 0 when the process was started alone. The apps answer --help and a bad
// command line before MPI_Init (every rank parses the same argv and reaches the same answer, so
// this rank 0 alone prints it): no MPI start-up for an answer that needs none, and none of its
// cost (a singleton's MPI_Init forks an orted: about 0.3 s).
int launcher_rank();

// A check that runs one of the project's parsers (fsdp::parse_dtype, ...) on an option's text:
// the parser's fsdp::Error becomes the option's error, in the parser's own words. Installed with
// ->transform(), the text is replaced by what `parse` returns (sizes: "1K" -> "1024"); with
// ->check() it stays as typed.
CLI::Validator parsed_by(std::function<std::string(const std::string&)> parse);
// The same for a parser whose result the caller converts again later (fsdp::parse_dtype): the
// text stays as typed when `parse` accepts it.
template <class Parse>
CLI::Validator accepted_by(Parse parse) {
  return parsed_by([parse](const std::string& text) {
    parse(text);
    return text;
  });
}

// A check for a whole decimal integer in [lo, hi] (std::from_chars over all of it: no '+',
// spaces or fraction). Its message is "expected <what>, got '<text>'"; `what` defaults to
// "an integer in [lo, hi]".
CLI::Validator integer_in(long long lo, long long hi, const std::string& what = "");

}  // namespace fsdp_cli
