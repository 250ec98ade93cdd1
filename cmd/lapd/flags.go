package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// usageError is a bad command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// flagSet wraps flag.FlagSet so that every flag also reads LAPD_<NAME> from
// the environment (flags win).
type flagSet struct {
	*flag.FlagSet
	env func(string) string
}

func newFlagSet(name string, out io.Writer, env func(string) string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	return &flagSet{FlagSet: fs, env: env}
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
	f.IntVar(p, name, def, usage+" (env "+envName(name)+")")
}

func (f *flagSet) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	f.DurationVar(p, name, def, usage+" (env "+envName(name)+")")
}

// parse applies the environment, then the arguments.
func (f *flagSet) parse(args []string) error {
	var envErr error
	f.VisitAll(func(fl *flag.Flag) {
		if envErr != nil {
			return
		}
		if v := f.env(envName(fl.Name)); v != "" {
			if err := fl.Value.Set(v); err != nil {
				envErr = usageError{fmt.Sprintf("environment %s=%q: %v", envName(fl.Name), v, err)}
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := f.FlagSet.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return usageError{err.Error()}
	}
	if f.NArg() > 0 {
		return usageError{fmt.Sprintf("%s: unexpected argument %q (flags start with --)", f.Name(), f.Arg(0))}
	}
	return nil
}

func osEnv(k string) string { return os.Getenv(k) }
