package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func newManCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "man --dir DIR",
		Short: "Write ferry's man pages, one per command, from its help",
		Long: `man writes a man page (section 1) for ferry and each of its commands into
--dir, made from the same text as --help (make man puts them in bin/man).
Read one with: man -l DIR/ferry-migrate.1`,
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // pages that do not change with the day they were made
			if err := doc.GenManTree(root, &doc.GenManHeader{Title: "FERRY", Section: "1", Source: versionLine()}, dir); err != nil {
				return err
			}
			fmt.Printf("man pages in %s\n", dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write the pages to (required)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}
