package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// usageError is a bad command line: exit code 2. run adds a line pointing
// at the command's --help.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// flagSet wraps flag.FlagSet so that every flag also reads LAPD_<NAME> from
// the environment (flags win), help goes to stdout when asked for, and a bad
// command line is reported in one sentence (with "did you mean" for an
// unknown flag) instead of the whole usage.
type flagSet struct {
	*flag.FlagSet
	env  func(string) string
	help io.Writer
	cmd  string // "lapd serve"
}

// newFlagSet returns a flag set for cmd ("lapd serve"); help (the output of
// --help) is written to out.
func newFlagSet(cmd string, out io.Writer, env func(string) string) *flagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, not printed; help is printed by parse
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, env: env, help: out, cmd: cmd}
}

// envName turns "data-dir" into "LAPD_DATA_DIR".
func envName(flagName string) string {
	return "LAPD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (f *flagSet) String(p *string, name, def, usage string) {
	f.StringVar(p, name, def, usage+" (env "+envName(name)+")")
}

func (f *flagSet) Bool(p *bool, name string, def bool, usage string) {
	f.BoolVar(p, name, def, usage+" (env "+envName(name)+")")
}

func (f *flagSet) Int(p *int, name string, def int, usage string) {
	*p = def
	f.Var((*intValue)(p), name, usage+" (env "+envName(name)+")")
}

func (f *flagSet) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	f.Var((*durationValue)(p), name, usage+" (env "+envName(name)+")")
}

// durationValue is a time.Duration flag whose parse error says what to type.
type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("not a duration: use a duration like 60s (units ms, s, m, h; did you mean %ss?)", s)
		}
		return errors.New("not a duration: use a duration like 60s (units ms, s, m, h)")
	}
	*d = durationValue(v)
	return nil
}

// String writes whole hours, minutes or seconds the short way (24h, 10m,
// 15s), as people type them.
func (d *durationValue) String() string {
	v := time.Duration(*d)
	switch {
	case v == 0:
		return "0s"
	case v%time.Hour == 0:
		return strconv.FormatInt(int64(v/time.Hour), 10) + "h"
	case v%time.Minute == 0:
		return strconv.FormatInt(int64(v/time.Minute), 10) + "m"
	case v%time.Second == 0:
		return strconv.FormatInt(int64(v/time.Second), 10) + "s"
	}
	return v.String()
}

// intValue is an int flag whose parse error says what to type.
type intValue int

func (i *intValue) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not a whole number")
	}
	*i = intValue(v)
	return nil
}

func (i *intValue) String() string { return strconv.Itoa(int(*i)) }

// errHelp is returned by parse after printing --help: the command exits 0.
var errHelp = flag.ErrHelp

// parse applies the environment, then the arguments. On -h/--help it prints
// the help to the help writer and returns flag.ErrHelp.
func (f *flagSet) parse(args []string) error {
	var envErr error
	f.VisitAll(func(fl *flag.Flag) {
		if envErr != nil {
			return
		}
		if v := f.env(envName(fl.Name)); v != "" {
			if err := fl.Value.Set(v); err != nil {
				envErr = f.usage(fmt.Sprintf("environment %s=%q: %v", envName(fl.Name), v, err))
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := f.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp()
			return errHelp
		}
		return f.usage(f.explain(err))
	}
	if f.NArg() > 0 {
		return f.usage(fmt.Sprintf("unexpected argument %q (flags start with --)", f.Arg(0)))
	}
	return nil
}

// usage is a usage error of this command (run adds the --help pointer).
func (f *flagSet) usage(msg string) usageError { return usageError{msg} }

var (
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	reInvalid   = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]*): (.*)$`)
	reNeedsArg  = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// explain rewrites the flag package's error messages in lapd's words.
func (f *flagSet) explain(err error) string {
	msg := err.Error()
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		s := "unknown flag --" + m[1]
		if sug := f.suggest(m[1]); len(sug) > 0 {
			s += " (did you mean --" + strings.Join(sug, " or --") + "?)"
		}
		return s
	}
	if m := reInvalid.FindStringSubmatch(msg); m != nil {
		why := m[3]
		if fl := f.Lookup(m[2]); fl != nil {
			if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				why = "want true or false"
			}
		}
		return fmt.Sprintf("--%s %q: %s", m[2], m[1], why)
	}
	if m := reNeedsArg.FindStringSubmatch(msg); m != nil {
		return "--" + m[1] + " needs a value"
	}
	return msg
}

// flagSynonyms maps words people type for a flag to lapd's name for it.
var flagSynonyms = map[string]string{
	"port": "addr", "listen": "addr", "host": "addr", "bind": "addr", "address": "addr",
	"data": "data-dir", "dir": "data-dir", "db": "data-dir", "database": "data-dir",
	"origin": "origins", "cors": "origins", "allowed-origins": "origins",
	"anonymous": "allow-anonymous", "anon": "allow-anonymous",
	"ttl": "token-ttl", "expiry": "token-ttl",
	"verbose": "log-level", "debug": "log-level", "v": "log-level",
	"public": "public-url", "base-url": "public-url",
	"timeout": "shutdown-timeout",
}

// suggest names the defined flags an unknown name probably meant: a
// synonym, a small typo (edit distance ≤ 2) or a prefix.
func (f *flagSet) suggest(name string) []string {
	name = strings.ToLower(strings.TrimLeft(name, "-"))
	if i := strings.IndexByte(name, '='); i >= 0 {
		name = name[:i]
	}
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if !seen[s] && f.Lookup(s) != nil {
			seen[s] = true
			out = append(out, s)
		}
	}
	if s, ok := flagSynonyms[name]; ok {
		add(s)
	}
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	f.VisitAll(func(fl *flag.Flag) {
		d := editDistance(name, fl.Name)
		if d <= 2 || (len(name) >= 3 && strings.HasPrefix(fl.Name, name)) {
			cs = append(cs, cand{fl.Name, d})
		}
	})
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].d < cs[j].d })
	for _, c := range cs {
		if len(out) >= 3 {
			break
		}
		add(c.name)
	}
	return out
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// printHelp writes the command's flags in --name form.
func (f *flagSet) printHelp() {
	w := f.help
	fmt.Fprintf(w, "Usage: %s [flags]\n\nFlags (each can also be set with the environment variable named after it; flags win):\n", f.cmd)
	f.VisitAll(func(fl *flag.Flag) {
		typ, usage := flag.UnquoteUsage(fl)
		if _, ok := fl.Value.(*durationValue); ok && typ == "value" {
			typ = "duration"
		}
		if _, ok := fl.Value.(*intValue); ok && typ == "value" {
			typ = "int"
		}
		line := "  --" + fl.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n      %s", line, usage)
		if def := fl.DefValue; def != "" && def != "0" && def != "0s" && def != "false" {
			if typ == "string" {
				def = strconv.Quote(def)
			}
			fmt.Fprintf(w, " (default %s)", def)
		}
		fmt.Fprintln(w)
	})
}

func osEnv(k string) string { return os.Getenv(k) }
