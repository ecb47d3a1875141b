set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/table2.png'
set title 'table2: ELDR''s TPOT change vs the decode pool, 8 prefill, 95% load, Llama-4-Maverick-17B-128E-Instruct'
set xlabel 'decode workers'
set ylabel 'mean TPOT vs best baseline (%)'
$d0 << EOD
8 -5.67639 -0.461243 -5.21515
16 -5.88871 -0.588436 -5.30028
24 -5.54474 -0.54128 -5.00346
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'ELDR vs the best baseline', $d0 using 1:3 with linespoints lt 2 dt 1 title 'replay control (eldr-permuted) alone', $d0 using 1:4 with linespoints lt 3 dt 1 title 'ELDR net of the replay control'
